package config

import (
	"fmt"
	"reflect"
)

// checkShape refuses a value whose shape cannot be the field's: a list or
// a map where one value belongs, a map or a list of lists where a list of
// values belongs. What is left (a number where a string belongs, "30s"
// for a duration) is the values' business (checkType, Validate). The
// error names the key, never the value: it may be a secret.
func checkShape(key string, field, val any) error {
	want := reflect.TypeOf(field)
	if want == nil || val == nil {
		return nil
	}
	got := shapeOf(val)
	switch want.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
		if got != "" {
			return &KeyError{Key: key, Err: fmt.Errorf("want %s, got %s", kindName(want), got)}
		}
	case reflect.Slice:
		if want.Elem().Kind() != reflect.String {
			return nil // routes: checkRoutes
		}
		if got == "a map" {
			return &KeyError{Key: key, Err: fmt.Errorf("want a list of strings, got %s", got)}
		}
		if list, ok := val.([]any); ok {
			for i, e := range list {
				if shapeOf(e) != "" {
					return &KeyError{Key: fmt.Sprintf("%s[%d]", key, i), Err: fmt.Errorf("want a string, got %s", shapeOf(e))}
				}
			}
		}
	}
	return nil
}

// shapeOf says "a list" or "a map" for a composite value, "" for a scalar.
func shapeOf(v any) string {
	switch reflect.ValueOf(v).Kind() {
	case reflect.Slice, reflect.Array:
		if _, ok := v.([]byte); ok {
			return ""
		}
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a map"
	}
	return ""
}

func kindName(t reflect.Type) string {
	switch {
	case t.String() == "time.Duration":
		return "a duration such as \"30s\""
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	}
	return "a number"
}
