package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/viper"
)

// Route is one entry of dispatch.routes: events whose aggregate_type and
// event_type match its globs (an empty one matches any value) go to the
// destination To. The globs are checked by the dispatch package
// (dispatch.ParseGlob) through app.Check.
type Route struct {
	AggregateType string `mapstructure:"aggregate_type"`
	EventType     string `mapstructure:"event_type"`
	To            string `mapstructure:"to"`
}

// DefaultDestination is the name of the destination the top-level
// dispatch.sink configures, and where events no route matches go.
const DefaultDestination = "default"

const (
	destinationsKey = "dispatch.destinations"
	routesKey       = "dispatch.routes"
	// destinationsEnv starts the environment variables of named
	// destinations: OUTBOXD_DISPATCH_DESTINATIONS_<NAME>_<KEY>.
	destinationsEnv = "OUTBOXD_DISPATCH_DESTINATIONS_"
)

// Destination is one named destination's settings: a sink and its section,
// under the key prefix Key ("dispatch" for the top-level one,
// "dispatch.destinations.<name>" for the others).
type Destination struct {
	Name     string
	Key      string
	Dispatch Dispatch
}

// Destinations lists the destinations: DefaultDestination from the
// top-level dispatch.sink first when that is one (see TopLevelDestination),
// then dispatch.destinations by name.
func (c *Config) Destinations() []Destination {
	var out []Destination
	if c.TopLevelDestination() {
		out = append(out, Destination{Name: DefaultDestination, Key: "dispatch", Dispatch: c.Dispatch})
	}
	for _, name := range slices.Sorted(maps.Keys(c.Dispatch.Destinations)) {
		out = append(out, Destination{Name: name, Key: destinationsKey + "." + name, Dispatch: *c.Dispatch.Destinations[name]})
	}
	return out
}

// TopLevelDestination reports whether the top-level dispatch.sink is the
// destination DefaultDestination: always without dispatch.destinations (the
// single-sink configuration); with them, only when dispatch.sink was set
// (file, environment, --set), so that a routed configuration does not send
// what no route matches to the built-in default webhook.
func (c *Config) TopLevelDestination() bool {
	return len(c.Dispatch.Destinations) == 0 || c.sinkSet
}

// destinationName: what a destination may be called. Viper lowers the case
// of keys; the name is also part of OUTBOXD_DISPATCH_DESTINATIONS_<NAME>_...
var destinationName = regexp.MustCompile(`^[a-z0-9_]+$`)

// nested are the keys of Dispatch that exist only at the top level.
var nested = []string{"destinations", "routes"}

// destinationKey splits "dispatch.destinations.<name>.<rest>" into the
// name and the top-level key "dispatch.<rest>" it mirrors; ok is false for
// any other key, and for a rest that is not a setting a destination has.
func destinationKey(key string) (name, mirror string, ok bool) {
	tail, found := strings.CutPrefix(key, destinationsKey+".")
	if !found {
		return "", "", false
	}
	name, rest, found := strings.Cut(tail, ".")
	if !found || slices.Contains(nested, strings.Split(rest, ".")[0]) {
		return "", "", false
	}
	mirror = "dispatch." + rest
	if _, known := fields[mirror]; !known {
		return "", "", false
	}
	return name, mirror, true
}

// typeKey is the key of fields that gives key's type: key itself, or for a
// destination's setting the top-level key it mirrors.
func typeKey(key string) (string, bool) {
	if _, ok := fields[key]; ok {
		return key, true
	}
	if _, mirror, ok := destinationKey(key); ok {
		return mirror, true
	}
	if stringMapEntry(key) {
		tk, _ := typeKey(key[:strings.LastIndex(key, ".")])
		return tk, true
	}
	return "", false
}

// stringMapEntry: key is one entry of a map of strings
// (dispatch.webhook.headers.<name>, a destination's likewise).
func stringMapEntry(key string) bool {
	i := strings.LastIndex(key, ".")
	if i < 0 {
		return false
	}
	tk, ok := typeKey(key[:i])
	if !ok {
		return false
	}
	_, isMap := fields[tk].(map[string]string)
	return isMap
}

// setDestinationDefaults gives every destination named in v each dispatch
// key's default (sink excepted: a destination names its own), so strict
// decoding sees them and OUTBOXD_DISPATCH_DESTINATIONS_<NAME>_<KEY>
// overrides a destination named in the file or a --set.
func setDestinationDefaults(v *viper.Viper, defaults map[string]any) {
	names := map[string]bool{}
	for name := range v.GetStringMap(destinationsKey) {
		names[name] = true
	}
	// A destination named only in the environment: viper reads a variable
	// only for a key it knows, so the variable of its sink names it here.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if mid, ok := strings.CutPrefix(k, destinationsEnv); ok {
			if name, ok := strings.CutSuffix(mid, "_SINK"); ok && name != "" {
				names[strings.ToLower(name)] = true
			}
		}
	}
	for name := range names {
		for k, d := range defaults {
			rest, ok := strings.CutPrefix(k, "dispatch.")
			if !ok || slices.Contains(nested, strings.Split(rest, ".")[0]) {
				continue
			}
			if rest == "sink" {
				d = ""
			}
			v.SetDefault(destinationsKey+"."+name+"."+rest, d)
		}
	}
}

// checkRoutes checks the shape of dispatch.routes before decoding, so an
// error names the entry: a list of maps with string values under the keys
// of Route.
func checkRoutes(val any) error {
	if val == nil {
		return nil
	}
	list, ok := val.([]any)
	if !ok {
		return &KeyError{Key: routesKey, Err: fmt.Errorf("want a list of {aggregate_type, event_type, to}, got %v", val)}
	}
	for i, e := range list {
		key := fmt.Sprintf("%s[%d]", routesKey, i)
		m, ok := e.(map[string]any)
		if !ok {
			return &KeyError{Key: key, Err: fmt.Errorf("want a map {aggregate_type, event_type, to}, got %v", e)}
		}
		for k, v := range m {
			if k != "aggregate_type" && k != "event_type" && k != "to" {
				return &KeyError{Key: key + "." + k, Err: errors.New("unknown key (want aggregate_type, event_type, to)")}
			}
			if _, ok := v.(string); !ok {
				return &KeyError{Key: key + "." + k, Err: fmt.Errorf("want a string, got %v", v)}
			}
		}
	}
	return nil
}

// validateDispatch checks the destinations and routes as a whole; each
// destination's own settings belong to its sink (app.Check).
func (c *Config) validateDispatch() error {
	d := c.Dispatch
	for _, name := range slices.Sorted(maps.Keys(d.Destinations)) {
		key := destinationsKey + "." + name
		switch {
		case !destinationName.MatchString(name):
			return bad(key, "a destination's name is lower-case letters, digits and '_'")
		case name == DefaultDestination && c.sinkSet:
			return bad(key, "the top-level dispatch.sink is the destination %q: configure it there, or remove dispatch.sink", DefaultDestination)
		case d.Destinations[name] == nil || d.Destinations[name].Sink == "":
			return bad(key+".sink", "must be set: a destination is a sink and its section")
		}
	}
	names := map[string]bool{}
	for _, dest := range c.Destinations() {
		names[dest.Name] = true
		switch b := dest.Dispatch.Breaker; {
		case b.Failures < 0:
			return bad(dest.Key+".breaker.failures", "must be 0 (never open) or more, got %d", b.Failures)
		case b.ProbeInterval <= 0:
			return bad(dest.Key+".breaker.probe_interval", "must be positive, got %s", b.ProbeInterval)
		}
	}
	for i, r := range d.Routes {
		key := fmt.Sprintf("%s[%d]", routesKey, i)
		switch {
		case r.AggregateType == "" && r.EventType == "":
			return bad(key, "needs aggregate_type or event_type (or both): a route that matches everything is what the destination %q is for", DefaultDestination)
		case r.To == "":
			return bad(key+".to", "must name a destination")
		case !names[r.To]:
			return bad(key+".to", "unknown destination %q (have %s)", r.To, strings.Join(slices.Sorted(maps.Keys(names)), ", "))
		}
	}
	return nil
}

// allSecrets is the table secrets with each dispatch secret repeated for
// every destination, under its own keys.
func (c *Config) allSecrets() []secret {
	out := slices.Clone(secrets)
	for _, name := range slices.Sorted(maps.Keys(c.Dispatch.Destinations)) {
		if c.Dispatch.Destinations[name] == nil {
			continue
		}
		for _, sec := range secrets {
			if sec.section != DispatchSection {
				continue
			}
			sec.key = strings.Replace(sec.key, "dispatch.", destinationsKey+"."+name+".", 1)
			if sec.file != "" {
				sec.file = strings.Replace(sec.file, "dispatch.", destinationsKey+"."+name+".", 1)
			}
			out = append(out, sec)
		}
	}
	return out
}

// sinkSetExplicitly: dispatch.sink came from the file, the environment or
// a --set, not from its default.
func sinkSetExplicitly(v *viper.Viper, sets []string) bool {
	if _, inEnv := os.LookupEnv("OUTBOXD_DISPATCH_SINK"); inEnv || v.InConfig("dispatch.sink") {
		return true
	}
	return slices.ContainsFunc(sets, func(s string) bool {
		k, _, _ := strings.Cut(s, "=")
		return strings.ToLower(strings.TrimSpace(k)) == "dispatch.sink"
	})
}

// walkDestinations adds each destination's settings under its key prefix,
// leaving out the keys that exist only at the top level.
func walkDestinations(m reflect.Value, prefix string, out map[string]any) {
	for _, name := range m.MapKeys() {
		p := prefix + "." + name.String()
		d := m.MapIndex(name)
		if d.IsNil() {
			continue
		}
		inner := map[string]any{}
		walk(d.Elem(), p, inner)
		for k, v := range inner {
			if rest := strings.TrimPrefix(k, p+"."); !slices.Contains(nested, strings.Split(rest, ".")[0]) {
				out[k] = v
			}
		}
	}
}

// routesShown is dispatch.routes as `outboxd config` prints it.
func routesShown(routes []Route) []map[string]string {
	out := make([]map[string]string, 0, len(routes))
	for _, r := range routes {
		m := map[string]string{"to": r.To}
		if r.AggregateType != "" {
			m["aggregate_type"] = r.AggregateType
		}
		if r.EventType != "" {
			m["event_type"] = r.EventType
		}
		out = append(out, m)
	}
	return out
}
