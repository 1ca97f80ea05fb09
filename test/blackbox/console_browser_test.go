package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxd/outboxd/internal/testkit"
)

// consoleToken is http.auth_token in the console's tests.
const consoleToken = "console-test-token"

// screenshotsEnv names a folder (docs/ for the operations guide) where the
// console's tests write screenshots of what they saw; unset: none.
const screenshotsEnv = "OUTBOXD_CONSOLE_SCREENSHOTS"

// chromiumPath is Debian's chromium (scripts/chromium.sh installs it), or "".
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser is a headless Chromium of the test's own (a fresh profile,
// nothing fetched from outside), closed at cleanup. Without chromium the
// test is skipped, except in CI, where it fails.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed: scripts/chromium.sh installs it (scripts/test.sh runs it)")
		}
		t.Skip("chromium is not installed: run scripts/chromium.sh to run the console's browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("headless", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil { // starts the browser, without a deadline
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// run runs the browser's steps within a wait's bound, failing the test
// with what the page showed when one fails.
func run(t *testing.T, b context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	get(t, b, what, chromedp.Steps(steps...))
}

// get runs one action returning a value within a wait's bound, as run.
func get[T any](t *testing.T, b context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b, 2*waitTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		sctx, scancel := context.WithTimeout(b, 5*time.Second)
		defer scancel()
		body, _ := chromedp.Run(sctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("browser: %s: %v; the page said:\n%s", what, err, trunc(body, 1500))
	}
	return v
}

// flashOf waits for the console's flash message about action and returns
// it. A button's form posts, and the answer redirects to a page carrying
// the message: until that page is in, the page before it (which may have a
// flash of its own) is still there and its nodes vanish under a query, so
// the message is read by script, again until it names action.
func flashOf(t *testing.T, b context.Context, action string) string {
	t.Helper()
	var flash string
	waitFor(t, "the console's answer to "+action, func() bool {
		ctx, cancel := context.WithTimeout(b, 5*time.Second)
		defer cancel()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("flash") || {}).textContent || ""`))
		flash = v
		return err == nil && strings.Contains(flash, action)
	}, func() string { return "the page's flash: " + strconv.Quote(flash) })
	return flash
}

// signIn opens the console of r, is sent to the sign-in form, signs in
// with the token and lands on the overview.
func signIn(t *testing.T, b context.Context, r *replica) {
	t.Helper()
	// The replica's operations port answers first; if it does not, its log
	// says why, which the browser's page cannot.
	waitFor(t, "the operations port of "+r.addr+" answering /livez", func() bool {
		code, _ := r.get("/livez")
		return code == http.StatusOK
	}, func() string { return "its log's tail:\n" + r.tail(30) })
	run(t, b, "sign in on "+r.addr,
		chromedp.Navigate("http://"+r.addr+"/ui"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), consoleToken),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("leader")))
}

// screenshot writes the page to $OUTBOXD_CONSOLE_SCREENSHOTS/name when set.
func screenshot(t *testing.T, b context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	png := get(t, b, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil { //nolint:gosec // a picture for the docs
		t.Fatal(err)
	}
}

// twoConsoleReplicas starts replicas "first" and "second" with the
// token, the config file cfg ("" for none), and returns the leader first.
func twoConsoleReplicas(t *testing.T, e *testBundle, cfg string) (leader, standby *replica) {
	t.Helper()
	var extra []string
	if cfg != "" {
		extra = []string{"--config", cfg}
	}
	e.set("OUTBOXD_HTTP_AUTH_TOKEN", consoleToken, "OUTBOXD_INSTANCE_ID", "first")
	first := e.start(extra...)
	if !first.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "lock acquired" && rec["lock"] == "lock:outbox:poller"
	}) {
		t.Fatalf("the first replica never led; tail:\n%s", first.tail(10))
	}
	e.set("OUTBOXD_HTTP_ADDR", freeAddr(t), "OUTBOXD_INSTANCE_ID", "second")
	second := e.start(extra...)
	return first, second
}

// The overview shows who leads, with its fencing token, and each replica:
// read by a signed-in browser from a standby's console.
func TestConsoleShowsTheLeaderAndItsReplicas(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	leaderRep, standby := twoConsoleReplicas(t, e, "")
	e.insertMany("order", 4, 5)
	waitFor(t, "the rows delivered", func() bool { return e.count("dispatched_at IS NULL") == 0 }, e.describeRows("dispatched_at IS NULL"))

	signIn(t, b, standby)
	var leader, token string
	var replicas int
	waitFor(t, "both replicas on the overview", func() bool {
		run(t, b, "reload the overview", chromedp.Navigate("http://"+standby.addr+"/ui"))
		leader = get(t, b, "the leader", chromedp.Text(chromedp.CSS(".leader-name")))
		token = get(t, b, "its token", chromedp.Text(chromedp.CSS(".leader-token")))
		replicas = get(t, b, "the replicas", chromedp.Evaluate[int](`document.querySelectorAll("tr.replica").length`))
		return replicas == 2
	}, func() string { return "replicas shown: " + strconv.Itoa(replicas) })
	var fence int64
	if err := e.pool.QueryRow(context.Background(), `SELECT token FROM outbox_fence WHERE lock_name = 'lock:outbox:poller'`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	if leader != "first" || token != strconv.FormatInt(fence, 10) {
		t.Errorf("the overview shows leader %q with token %q; want first with %d", leader, token, fence)
	}
	if os.Getenv(screenshotsEnv) != "" { // the leader's console, whose chart shows the deliveries
		e.insertMany("order", 4, 50)
		time.Sleep(6 * time.Second) // another sample of the counters
		signIn(t, b, leaderRep)
		screenshot(t, b, "console.png")
	}
}

// A pause clicked in the console holds the destination's events, charged
// nothing, across a kill of the leader; a resume clicked in the next
// leader's console delivers them in order.
func TestConsolePauseHoldsDeliveriesAcrossALeaderKill(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := setup(t)
	rc := newRecorder(t, nil)
	cfg := pausedConfig(t, rc.URL())
	// A lease that outlasts the suite's busiest moments: the pause and the
	// resume are to be acknowledged by a leader, not find the lease lapsed.
	e.set("OUTBOXD_POLLER_LOCK_TTL", "6s")
	leader, standby := twoConsoleReplicas(t, e, cfg)

	signIn(t, b, leader)
	run(t, b, "pause held", chromedp.Click(chromedp.CSS(`tr.destination[data-name="held"] button.pause`)))
	flash := flashOf(t, b, "pause held")
	if !strings.Contains(flash, "pause held: acknowledged by the leader first") {
		t.Errorf("after the pause the console says %q", flash)
	}
	held := e.insertMany("held", 3, 3)
	e.insertMany("flow", 3, 3)
	waitFor(t, "the other destination's rows delivered", func() bool {
		return e.count(`aggregate_type = 'flow' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'flow' AND dispatched_at IS NULL"))
	untouched := func(when string) {
		t.Helper()
		if n := e.count(`aggregate_type = 'held' AND (dispatched_at IS NOT NULL OR dead_at IS NOT NULL OR attempts > 0)`); n > 0 {
			t.Fatalf("%s: %d paused rows sent, dead or charged", when, n)
		}
	}
	untouched("paused")

	// The console refreshes itself: left on the leader's page, the tab
	// would reload into the browser's error page once the leader is gone,
	// and that page's own reloads can take over the next navigation.
	run(t, b, "leave the leader's page", chromedp.Navigate("about:blank"))
	leader.kill()
	pausedLog := func(_ string, rec map[string]any) bool {
		return rec["msg"] == "destination paused" && rec["destination"] == "held"
	}
	if !standby.awaitLog(waitTimeout, pausedLog) {
		t.Fatalf("the next leader never logged the pause; tail:\n%s", standby.tail(20))
	}
	e.insertMany("flow", 3, 2)
	waitFor(t, "the next leader delivers the other destination", func() bool {
		return e.count(`aggregate_type = 'flow' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'flow' AND dispatched_at IS NULL"))
	untouched("after the leader's kill")

	signIn(t, b, standby)
	if state := get(t, b, "held's state", chromedp.Text(chromedp.CSS(`tr.destination[data-name="held"] .paused`))); state != "paused" {
		t.Errorf("the next leader's console shows held as %q", state)
	}
	run(t, b, "resume held", chromedp.Click(chromedp.CSS(`tr.destination[data-name="held"] button.resume`)))
	flash = flashOf(t, b, "resume held")
	if !strings.Contains(flash, "resume held: acknowledged by the leader second") {
		t.Errorf("after the resume the console says %q", flash)
	}
	waitFor(t, "the paused rows delivered after resume", func() bool {
		return e.count(`aggregate_type = 'held' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'held' AND dispatched_at IS NULL"))
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Errorf("order broken: %v", v)
	}
	ok := rc.OKCounts()
	for _, id := range held {
		if ok[id] == 0 {
			t.Errorf("paused event %d not delivered after resume", id)
		}
	}
}

// A replay confirmed in the console requeues exactly the filtered dead
// rows, after a confirmation that counts them, and they are delivered;
// a dead row's page shows its attempt history and, signed in, its payload.
func TestConsoleReplayDeliversTheDeadRows(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := setup(t)
	var refuse atomic.Bool
	refuse.Store(true)
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if refuse.Load() && strings.HasPrefix(req.Agg, "bad/") {
			return testkit.Reply{Status: 503}
		}
		return testkit.Reply{}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "2")
	leader, _ := twoConsoleReplicas(t, e, "")
	bad := e.insertMany("bad", 2, 3)
	e.insertMany("good", 2, 3)
	waitFor(t, "the refused rows dead", func() bool { return e.count("dead_at IS NOT NULL") == len(bad) },
		e.describeRows("true"))

	signIn(t, b, leader)
	run(t, b, "a dead row's page", chromedp.Navigate("http://"+leader.addr+"/ui/dead/"+strconv.FormatInt(bad[0], 10)))
	payload := get(t, b, "its payload", chromedp.Text(chromedp.ID("payload")))
	attempts := get(t, b, "its attempts", chromedp.Evaluate[int](`document.querySelectorAll("tr.attempt").length`))
	if attempts != 2 || !strings.Contains(payload, `"n"`) {
		t.Errorf("dead row page: %d attempts shown (want 2), payload %q", attempts, payload)
	}
	screenshot(t, b, "console-dead.png")

	run(t, b, "confirm a replay of aggregate type bad",
		chromedp.Navigate("http://"+leader.addr+"/ui/dead?aggregate=bad"),
		chromedp.Click(chromedp.ID("replay-these")))
	count := get(t, b, "the count", chromedp.Text(chromedp.ID("count")))
	if count != strconv.Itoa(len(bad)) {
		t.Fatalf("the confirmation counts %s rows; want %d", count, len(bad))
	}
	if n := e.count("dead_at IS NULL AND aggregate_type = 'bad'"); n != 0 {
		t.Fatalf("the confirmation page changed %d rows before the click", n)
	}
	refuse.Store(false)
	run(t, b, "replay", chromedp.Click(chromedp.ID("confirm")))
	changed := get(t, b, "the replay's outcome", chromedp.Text(chromedp.ID("changed")))
	if changed != strconv.Itoa(len(bad)) {
		t.Errorf("the result says %s requeued; want %d", changed, len(bad))
	}
	waitFor(t, "the replayed rows delivered", func() bool { return e.count("dispatched_at IS NULL") == 0 },
		e.describeRows("dispatched_at IS NULL"))
	ok := rc.OKCounts()
	for _, id := range bad {
		if ok[id] == 0 {
			t.Errorf("replayed event %d not delivered", id)
		}
	}
	if !leader.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "console write" && rec["op"] == "replay" && rec["changed"] == float64(len(bad))
	}) {
		t.Errorf("no console write log line for the replay; tail:\n%s", leader.tail(10))
	}
}

// A resend confirmed in the console, after a count, sends a delivered
// aggregate's events again, in their order, each marked with the id it
// copies; the other aggregates are not sent again.
func TestConsoleResendRedeliversAnAggregateInOrder(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	leader, _ := twoConsoleReplicas(t, e, "")
	e.insertMany("acct", 3, 4)
	waitFor(t, "the rows delivered", func() bool { return e.count("dispatched_at IS NULL") == 0 }, e.describeRows("dispatched_at IS NULL"))
	originals := e.rows("aggregate_type = 'acct' AND aggregate_id = '1'")
	before := len(rc.Requests())

	signIn(t, b, leader)
	run(t, b, "count a resend of acct/1",
		chromedp.Navigate("http://"+leader.addr+"/ui/resend"),
		chromedp.SendKeys(chromedp.ID("resend-aggregate"), "acct/1"),
		chromedp.Click(chromedp.ID("resend-count")))
	if count := get(t, b, "the count", chromedp.Text(chromedp.ID("count"))); count != strconv.Itoa(len(originals)) {
		t.Fatalf("the confirmation counts %s rows; want %d", count, len(originals))
	}
	if n := len(rc.Requests()); n != before {
		t.Fatalf("the count sent %d events", n-before)
	}
	run(t, b, "resend", chromedp.Click(chromedp.ID("confirm")))
	if changed := get(t, b, "the resend's outcome", chromedp.Text(chromedp.ID("changed"))); changed != strconv.Itoa(len(originals)) {
		t.Errorf("the result says %s resent; want %d", changed, len(originals))
	}
	var resent []testkit.Request
	waitFor(t, "the aggregate sent again", func() bool {
		resent = nil
		for _, r := range rc.Requests()[before:] {
			if r.Status/100 == 2 {
				resent = append(resent, r)
			}
		}
		return len(resent) >= len(originals)
	}, func() string { return strconv.Itoa(len(resent)) + " sent again" })
	if len(resent) != len(originals) {
		t.Fatalf("%d events sent again; want %d", len(resent), len(originals))
	}
	for i, r := range resent {
		from := resentFrom(t, r)
		if r.Agg != "acct/1" || from != strconv.FormatInt(originals[i].ID, 10) {
			t.Errorf("sent again #%d: %s resent from %q; want acct/1 from %d (in order)", i, r.Agg, from, originals[i].ID)
		}
	}
}

// resentFrom is the id a resent event copies: its webhook header
// Outbox-Resent-From, or the entry outbox-resent-from of the event's own
// headers in the body.
func resentFrom(t *testing.T, r testkit.Request) string {
	t.Helper()
	if from := r.Header.Get("Outbox-Resent-From"); from != "" {
		return from
	}
	var body struct {
		Headers map[string]any `json:"headers"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("event body: %v: %s", err, trunc(string(r.Body), 300))
	}
	if v, ok := body.Headers["outbox-resent-from"]; ok {
		return fmt.Sprint(v)
	}
	return ""
}
