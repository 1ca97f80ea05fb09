package rabbitmq

import (
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// TestPermissions: a user without configure permission publishes to an
// exchange the operator declared (checked passively); while the exchange
// is missing it is a retryable failure saying what to do. A user refused
// write permission gets a permanent failure. Users are made with
// rabbitmqctl, so the test needs the broker to be this machine's.
func TestPermissions(t *testing.T) {
	t.Parallel()
	ctl := rabbitmqctl(t)
	user := randomName(t)
	if out, err := exec.Command("rabbitmqctl", "-q", "add_user", user, "secret-"+user).CombinedOutput(); err != nil {
		t.Skipf("rabbitmqctl cannot manage the local broker (%v): %s", err, out)
	}
	t.Cleanup(func() { ctl("delete_user", user) })
	ctl("set_permissions", "-p", "/", user, "^$", ".*", ".*") // no configure
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "secret-"+user)
	a := newAdmin(t)

	s := newSink(t, Config{URL: u.String(), Exchange: a.exchange})
	res := send(t, s, ev(1, "deal", "1", "x"))
	if msg := fmt.Sprint(res[0].Err); res[0].Outcome != R || !strings.Contains(msg, "may not declare it") || strings.Contains(msg, "secret-") {
		t.Errorf("missing exchange, no configure permission: %v %q, want retryable saying what to do", res[0].Outcome, msg)
	}
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	allDelivered(t, send(t, s, ev(1, "deal", "1", "x")))
	if n := a.count(q); n != 1 {
		t.Errorf("queue holds %d, want 1", n)
	}

	ctl("set_permissions", "-p", "/", user, "^$", "^$", ".*") // no write either
	s2 := newSink(t, Config{URL: u.String(), Exchange: a.exchange})
	res = send(t, s2, ev(2, "deal", "1", "x"), ev(3, "deal", "1", "x"))
	wantOutcomes(t, res, P, NA)
	if msg := fmt.Sprint(res[0].Err); !dispatch.IsPermanent(res[0].Err) || !strings.Contains(msg, "write permission") {
		t.Errorf("write refused: %q, want permanent naming the permission", msg)
	}
}

// rabbitmqctl returns a runner for rabbitmqctl, or skips the test when it
// cannot manage the broker the tests use.
func rabbitmqctl(t *testing.T) func(args ...string) {
	t.Helper()
	if h := brokerHost(); !strings.HasPrefix(h, "127.0.0.1:") && !strings.HasPrefix(h, "localhost:") {
		t.Skipf("the broker (%s) is not this machine's: rabbitmqctl cannot make its users", h)
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("no rabbitmqctl to make users with")
	}
	return func(args ...string) {
		t.Helper()
		if out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v: %s", args[0], err, out)
		}
	}
}
