package console

import (
	"net/url"
	"testing"
	"time"
)

// The resend form's destination reaches the selection; alone it selects
// every row (the confirmation then asks for the box "every ... event").
func TestResendSelectionTakesTheDestination(t *testing.T) {
	v := url.Values{destParam: {"billing"}, "aggregate": {"deal/7"}}
	sel, err := parseSelection(OpResend, v, time.Now())
	if err != nil || sel.dest != "billing" || sel.resend.AggregateType != "deal" {
		t.Fatalf("got %+v, %v; want destination billing and aggregate deal/7", sel, err)
	}
	if !onlyBounds(formFields(url.Values{destParam: {"billing"}}, resendFields)) {
		t.Error("a destination alone counts as a filter")
	}
	if onlyBounds(formFields(v, resendFields)) {
		t.Error("an aggregate beside a destination does not count as a filter")
	}
	if _, err := parseSelection(OpReplay, url.Values{destParam: {"billing"}}, time.Now()); err == nil {
		t.Error("replay accepted a destination it would ignore")
	}
}
