// Package deploy_test checks the deployment artefacts against the code: they
// parse, their config loads, their env keys exist, and every metric they
// query is one outboxd exports.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/metrics"
)

// loaded is what the deploy tests read of an effective configuration.
type loaded struct {
	Postgres struct {
		DSN     string `yaml:"dsn"`
		DSNFile string `yaml:"dsn_file"`
	} `yaml:"postgres"`
	Dispatch struct {
		Webhook struct {
			Secret string `yaml:"secret"`
		} `yaml:"webhook"`
	} `yaml:"dispatch"`
	HTTP struct {
		Addr string `yaml:"addr"`
	} `yaml:"http"`
	ShutdownTimeout time.Duration `yaml:"-"`
}

// outboxd builds the binary once: the composition root (and so the loading
// with every default and check) is internal to cmd/outboxd, and the binary
// is what a replica runs.
var outboxd = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "outboxd-deploy-test")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "outboxd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/outboxd/outboxd/cmd/outboxd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
})

// loadConfig loads file with sets (key=value) as a replica does, with this
// process's environment, through `outboxd config`; the error is the
// binary's message when the configuration does not load.
func loadConfig(file string, sets []string) (*loaded, error) {
	bin, err := outboxd()
	if err != nil {
		return nil, err
	}
	args := []string{"config", "--config", file}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var c struct {
		loaded          `yaml:",inline"`
		ShutdownTimeout string `yaml:"shutdown_timeout"`
	}
	if err := yaml.Unmarshal(stdout.Bytes(), &c); err != nil {
		return nil, fmt.Errorf("outboxd config printed %q: %w", stdout.String(), err)
	}
	if c.loaded.ShutdownTimeout, err = time.ParseDuration(c.ShutdownTimeout); err != nil {
		return nil, fmt.Errorf("shutdown_timeout: %w", err)
	}
	return &c.loaded, nil
}

func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
}

func get(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

// envKey maps OUTBOXD_SECTION_KEY to a known config key, or "".
func envKey(env string) string {
	rest := strings.ToLower(strings.TrimPrefix(env, "OUTBOXD_"))
	for _, k := range config.Keys() {
		if strings.ReplaceAll(k, ".", "_") == rest {
			return k
		}
	}
	return ""
}

func TestEveryYAMLParses(t *testing.T) {
	t.Parallel()
	var files []string
	for _, pattern := range []string{"*.yml", "*/*.yaml"} {
		m, err := filepath.Glob(pattern)
		if err != nil || len(m) == 0 {
			t.Fatalf("%s matches no file (%v): nothing would be checked", pattern, err)
		}
		files = append(files, m...)
	}
	// The artefacts README points operators at must be among them.
	for _, want := range []string{"docker-compose.yml", "kubernetes/deployment.yaml", "prometheus/alerts.yaml"} {
		if !slices.Contains(files, filepath.FromSlash(want)) {
			t.Errorf("%s is not among the files checked %v", want, files)
		}
	}
	for _, f := range files {
		if len(docs(t, f)) == 0 {
			t.Errorf("%s: no documents", f)
		}
	}
}

func TestComposeRunsThreeReplicasWithKnownKeys(t *testing.T) {
	t.Parallel()
	c := docs(t, "docker-compose.yml")[0]
	services := get(c, "services").(map[string]any)
	replicas := 0
	for name := range services {
		if strings.HasPrefix(name, "outboxd-") {
			replicas++
		}
	}
	if replicas != 3 {
		t.Fatalf("%d outboxd replicas, want 3", replicas)
	}
	for _, s := range []string{"postgres", "redis", "migrate", "receiver"} {
		if services[s] == nil {
			t.Fatalf("service %s missing", s)
		}
	}
	env := get(c, "x-outboxd", "environment").(map[string]any)
	for k := range env {
		if envKey(k) == "" {
			t.Errorf("compose sets %s, which is no config key", k)
		}
	}
}

// The replicas' healthcheck asks /readyz through `outboxd health` (the
// image has no shell or curl); `outboxd version` always passed. Services
// that share the image but do not run the relay switch the check off.
func TestComposeHealthchecksAskReadyz(t *testing.T) {
	t.Parallel()
	services := get(docs(t, "docker-compose.yml")[0], "services").(map[string]any)
	for name, svc := range services {
		hc := get(svc, "healthcheck")
		test, _ := get(hc, "test").([]any)
		switch {
		case strings.HasPrefix(name, "outboxd-"):
			if len(test) < 3 || test[0] != "CMD" || test[1] != "/usr/local/bin/outboxd" || test[2] != "health" {
				t.Errorf("%s: healthcheck %v, want [CMD /usr/local/bin/outboxd health ...]", name, test)
			}
		case get(svc, "image") == "outboxd:local":
			if get(hc, "disable") != true {
				t.Errorf("%s: runs the outboxd image but not `run`: its healthcheck must be disabled, got %v", name, hc)
			}
		}
		for _, a := range test {
			if a == "version" {
				t.Errorf("%s: healthcheck runs `version`, which always passes", name)
			}
		}
	}
}

func TestDockerfileHealthcheck(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, then find the HEALTHCHECK instruction.
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	m := regexp.MustCompile(`(?m)^HEALTHCHECK .*\bCMD (\[.*\])\s*$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("Dockerfile has no HEALTHCHECK ... CMD [...] (exec form: distroless has no shell)")
	}
	var argv []string
	if err := json.Unmarshal([]byte(m[1]), &argv); err != nil {
		t.Fatalf("HEALTHCHECK CMD %s is not an exec-form JSON array: %v", m[1], err)
	}
	if len(argv) < 2 || argv[0] != "/usr/local/bin/outboxd" || argv[1] != "health" {
		t.Fatalf("HEALTHCHECK runs %v, want /usr/local/bin/outboxd health", argv)
	}
}

// The compose replicas' settings (the image's config.yaml plus the
// environment) pass validation, so they start rather than exit 2. Not
// parallel, nor TestSystemdConfigLoads: they set OUTBOXD_* variables, which
// the other tests' LoadConfig would read.
func TestComposeConfigLoads(t *testing.T) {
	env := get(docs(t, "docker-compose.yml")[0], "x-outboxd", "environment").(map[string]any)
	for k, v := range env {
		t.Setenv(k, v.(string))
	}
	cfg, err := loadConfig("../config.yaml", nil)
	if err != nil {
		t.Fatalf("compose replica config: %v", err)
	}
	if cfg.HTTP.Addr != "0.0.0.0:9090" {
		t.Fatalf("http.addr %s: the published port needs a wildcard address", cfg.HTTP.Addr)
	}
}

// The systemd unit's settings load, with its credentials in place.
// unitEnv sets, in this process, the OUTBOXD_* variables the unit file
// sets (%d: creds), and returns them.
func unitEnv(t *testing.T, file, creds string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{}
	for _, m := range regexp.MustCompile(`Environment=(OUTBOXD_[A-Z_]+)=(\S+)`).FindAllStringSubmatch(string(b), -1) {
		set[m[1]] = strings.ReplaceAll(m[2], "%d", creds)
		t.Setenv(m[1], set[m[1]])
	}
	return set
}

// The unit alone runs a sink without secrets (Kafka here); with the
// webhook-secret drop-in, the webhook's secret comes from its credential.
func TestSystemdConfigLoads(t *testing.T) {
	creds := t.TempDir()
	if err := os.WriteFile(filepath.Join(creds, "postgres-dsn"), []byte("postgres://outboxd:pw@db.internal:5432/app?sslmode=disable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if set := unitEnv(t, "systemd/outboxd@.service", creds); set["OUTBOXD_POSTGRES_DSN_FILE"] == "" || len(set) != 1 {
		t.Fatalf("the unit sets %v, want OUTBOXD_POSTGRES_DSN_FILE alone (a sink's secret belongs in a drop-in)", set)
	}
	cfg, err := loadConfig("../config.yaml", []string{"dispatch.sink=kafka", "dispatch.kafka.brokers=kafka.internal:9092"})
	if err != nil {
		t.Fatalf("systemd replica config, Kafka sink: %v", err)
	}
	// The credentials were read from the files the unit names (outboxd
	// config shows them redacted).
	if want := filepath.Join(creds, "postgres-dsn"); cfg.Postgres.DSNFile != want {
		t.Errorf("postgres.dsn_file %q, want %q", cfg.Postgres.DSNFile, want)
	}
	if want := "db.internal:5432/app"; !strings.Contains(cfg.Postgres.DSN, want) || strings.Contains(cfg.Postgres.DSN, ":pw@") {
		t.Errorf("postgres.dsn %q, want the credential's DSN (%s), redacted", cfg.Postgres.DSN, want)
	}

	if err := os.WriteFile(filepath.Join(creds, "webhook-secret"), []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if set := unitEnv(t, "systemd/webhook-secret.conf", creds); set["OUTBOXD_DISPATCH_WEBHOOK_SECRET_FILE"] == "" {
		t.Fatalf("the drop-in sets no OUTBOXD_DISPATCH_WEBHOOK_SECRET_FILE (it set %v)", set)
	}
	cfg, err = loadConfig("../config.yaml", nil)
	if err != nil {
		t.Fatalf("systemd replica config with the webhook drop-in: %v", err)
	}
	if cfg.Dispatch.Webhook.Secret == "" || strings.Contains(cfg.Dispatch.Webhook.Secret, "MfKQ9r8G") {
		t.Errorf("dispatch.webhook.secret %q, want the credential's secret, redacted", cfg.Dispatch.Webhook.Secret)
	}
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	kinds := map[string]map[string]any{}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	for _, f := range files {
		for _, d := range docs(t, f) {
			if k, _ := d["kind"].(string); k != "" {
				kinds[k] = d
			}
		}
	}
	dep := kinds["Deployment"]
	if dep == nil || kinds["PodDisruptionBudget"] == nil || kinds["ConfigMap"] == nil {
		t.Fatalf("want a Deployment, a PodDisruptionBudget and a ConfigMap, got %v", keys(kinds))
	}
	if r := get(dep, "spec", "replicas"); r != 3 {
		t.Fatalf("replicas %v, want 3", r)
	}
	pod := get(dep, "spec", "template", "spec")
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Fatal("pod must run as non-root")
	}
	ctr := get(pod, "containers").([]any)[0]
	if get(ctr, "livenessProbe", "httpGet", "path") != "/livez" || get(ctr, "readinessProbe", "httpGet", "path") != "/readyz" {
		t.Fatal("probes must use /livez and /readyz")
	}
	if get(ctr, "resources", "requests") == nil || get(ctr, "resources", "limits") == nil {
		t.Fatal("resources missing")
	}
	if min := get(kinds["PodDisruptionBudget"], "spec", "minAvailable"); min != 2 {
		t.Fatalf("PDB minAvailable %v", min)
	}
	checkSurvivesASecondApply(t, pod, ctr)
	checkAccountAndPolicies(t, kinds, pod)
	checkOpsToken(t, kinds, pod, ctr)
	checkImagesPinned(t, files)
	checkApplied(t, "NetworkPolicy", "networkpolicy.yaml")

	// The ConfigMap's config loads (secret files are mounted at run time).
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(get(kinds["ConfigMap"], "data", "config.yaml").(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(cfgFile, []string{"postgres.dsn_file=", "dispatch.webhook.secret_file=", "http.auth_token_file="})
	if err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	grace := time.Duration(get(pod, "terminationGracePeriodSeconds").(int)) * time.Second
	if grace <= cfg.ShutdownTimeout+2*time.Second {
		t.Fatalf("terminationGracePeriodSeconds %s must exceed shutdown_timeout %s plus the lock release", grace, cfg.ShutdownTimeout)
	}
	if cfg.HTTP.Addr != "0.0.0.0:9090" {
		t.Fatalf("http.addr %s: probes need the pod IP", cfg.HTTP.Addr)
	}
}

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("systemd/outboxd@.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, want := range []string{"Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "LoadCredential=", "RestartPreventExitStatus=2"} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %s", want)
		}
	}
	for _, m := range regexp.MustCompile(`Environment=(OUTBOXD_[A-Z_]+)=`).FindAllStringSubmatch(unit, -1) {
		if envKey(m[1]) == "" {
			t.Errorf("unit sets %s, which is no config key", m[1])
		}
	}
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		out, err := exec.Command(path, "verify", "--man=no", "systemd/outboxd@.service").CombinedOutput()
		// verify also reports the binary missing from this machine; anything else is a unit error.
		for _, line := range strings.Split(string(out), "\n") {
			if line != "" && !strings.Contains(line, "/usr/local/bin/outboxd") && !strings.Contains(line, "Failed to") {
				t.Errorf("systemd-analyze verify: %s (%v)", line, err)
			}
		}
	} else {
		t.Log("systemd-analyze not installed: unit checked by content only")
	}
}

var metricName = regexp.MustCompile(`outboxd_[a-z_]+`)

func exported(t *testing.T) map[string]bool {
	m := metrics.New()
	m.FenceRejections.WithLabelValues("x")
	m.LockHeld.WithLabelValues("x")
	m.LockAcquisitions.WithLabelValues("x")
	m.LockLosses.WithLabelValues("x")
	m.LockRenewFails.WithLabelValues("x")
	m.LockWait.WithLabelValues("x")
	m.ReconcileRuns.WithLabelValues("x")
	m.ReconcileSwept.WithLabelValues("x")
	m.Destinations([]string{"x"}, []string{"x"}, []string{"x"})
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range fams {
		n := f.GetName()
		out[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			out[n+suffix] = true
		}
	}
	return out
}

func TestAlertsAndDashboardQueryExportedMetrics(t *testing.T) {
	t.Parallel()
	have := exported(t)
	rules := get(docs(t, "prometheus/alerts.yaml")[0], "groups").([]any)[0].(map[string]any)["rules"].([]any)
	want := map[string]bool{"OutboxdNoLeader": false, "OutboxdMoreThanOneLeader": false, "OutboxdOldestPendingTooOld": false, "OutboxdSequenceRewind": false,
		"OutboxdFenceRejections": false, "OutboxdDeadLetters": false, "OutboxdNotScraped": false}
	for _, r := range rules {
		name, _ := get(r, "alert").(string)
		want[name] = true
		expr, _ := get(r, "expr").(string)
		if expr == "" || get(r, "labels", "severity") == nil || get(r, "annotations", "summary") == nil {
			t.Errorf("alert %s lacks expr, severity or summary", name)
		}
		for _, m := range metricName.FindAllString(expr, -1) {
			if !have[m] {
				t.Errorf("alert %s queries %s, which outboxd does not export", name, m)
			}
		}
		if name == "OutboxdNotScraped" && !strings.HasPrefix(expr, "absent(") {
			t.Errorf("alert %s: %q, want absent(...): it fires when no replica is scraped at all", name, expr)
		}
	}
	for name, ok := range want {
		if !ok {
			t.Errorf("alert %s missing", name)
		}
	}
	b, err := os.ReadFile("grafana/outboxd-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	if len(dash.Panels) < 8 {
		t.Fatalf("%d panels", len(dash.Panels))
	}
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				shown[m] = true
				if !have[m] {
					t.Errorf("panel %q queries %s, which outboxd does not export", p.Title, m)
				}
			}
		}
	}
	if !shown["outboxd_build_info"] {
		t.Error("no panel shows outboxd_build_info (which version runs where)")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkSurvivesASecondApply: the kustomization applies nothing immutable
// that names an image (a Job's template), every file it lists exists, and
// the pod migrates in an init container of the relay's own image; a
// startupProbe covers the start.
func checkSurvivesASecondApply(t *testing.T, pod, ctr any) {
	t.Helper()
	k := docs(t, "kubernetes/kustomization.yaml")[0]
	for _, r := range get(k, "resources").([]any) {
		for _, d := range docs(t, filepath.Join("kubernetes", r.(string))) {
			if d["kind"] == "Job" || d["kind"] == "CronJob" {
				t.Errorf("%s: a %s's pod template is immutable: a second apply with a new image fails", r, d["kind"])
			}
		}
	}
	inits, _ := get(pod, "initContainers").([]any)
	if len(inits) != 1 || get(inits[0], "image") != get(ctr, "image") || !slices.Equal(get(inits[0], "args").([]any)[:1], []any{"migrate"}) {
		t.Errorf("want one init container running migrate with the relay's image, got %v", inits)
	}
	if get(ctr, "startupProbe", "httpGet", "path") != "/livez" {
		t.Error("the relay has no startupProbe on /livez")
	}
	job := docs(t, "kubernetes/migrate-job.yaml")[0]
	if name, _ := get(job, "metadata", "name").(string); !strings.Contains(name, "VERSION") {
		t.Errorf("the optional migrate Job is named %q: it must carry the version (a template cannot change)", name)
	}
}

// checkAccountAndPolicies: the pods run as a ServiceAccount of their own
// without an API token; the NetworkPolicy selects them; the
// ServiceMonitor scrapes the Service's http port.
func checkAccountAndPolicies(t *testing.T, kinds map[string]map[string]any, pod any) {
	t.Helper()
	sa := kinds["ServiceAccount"]
	if sa == nil || sa["automountServiceAccountToken"] != false {
		t.Fatalf("want a ServiceAccount with automountServiceAccountToken: false, got %v", sa)
	}
	if get(pod, "serviceAccountName") != get(sa, "metadata", "name") || get(pod, "automountServiceAccountToken") != false {
		t.Error("the pod must use outboxd's ServiceAccount and mount no token")
	}
	np := kinds["NetworkPolicy"]
	if np == nil || get(np, "spec", "podSelector", "matchLabels", "app.kubernetes.io/name") != "outboxd" {
		t.Errorf("want a NetworkPolicy selecting outboxd's pods, got %v", np)
	}
	sm := kinds["ServiceMonitor"]
	svc := kinds["Service"]
	if sm == nil || svc == nil {
		t.Fatalf("want a ServiceMonitor and a Service, got %v", keys(kinds))
	}
	if get(sm, "spec", "selector", "matchLabels", "app.kubernetes.io/name") != get(svc, "metadata", "labels", "app.kubernetes.io/name") {
		t.Error("the ServiceMonitor does not select the Service")
	}
	port := get(sm, "spec", "endpoints").([]any)[0]
	if get(port, "port") != get(svc, "spec", "ports").([]any)[0].(map[string]any)["name"] || get(port, "path") != "/metrics" {
		t.Errorf("the ServiceMonitor scrapes %v, want the Service's http port at /metrics", port)
	}
}

// checkOpsToken: the ConfigMap's http.auth_token_file is a file the relay
// container mounts from a Secret, and the ServiceMonitor sends the same
// Secret's key as its bearer token: off loopback (http.addr 0.0.0.0), the
// dead letters' payloads are served only with the token.
func checkOpsToken(t *testing.T, kinds map[string]map[string]any, pod, ctr any) {
	t.Helper()
	var cm struct {
		HTTP struct {
			TokenFile string `yaml:"auth_token_file"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal([]byte(get(kinds["ConfigMap"], "data", "config.yaml").(string)), &cm); err != nil {
		t.Fatal(err)
	}
	file := cm.HTTP.TokenFile
	if file == "" {
		t.Fatal("the ConfigMap sets no http.auth_token_file: /dead would be refused on the pod IP")
	}
	var secret, key string
	for _, m := range get(ctr, "volumeMounts").([]any) {
		dir, _ := get(m, "mountPath").(string)
		rest, ok := strings.CutPrefix(file, dir+"/")
		if !ok || strings.Contains(rest, "/") {
			continue
		}
		for _, v := range get(pod, "volumes").([]any) {
			if get(v, "name") == get(m, "name") {
				secret, _ = get(v, "secret", "secretName").(string)
				key = rest
			}
		}
	}
	if secret == "" {
		t.Fatalf("http.auth_token_file %s is not in a directory the relay container mounts from a Secret", file)
	}
	creds := get(kinds["ServiceMonitor"], "spec", "endpoints").([]any)[0]
	if get(creds, "authorization", "type") != "Bearer" || get(creds, "authorization", "credentials", "name") != secret ||
		get(creds, "authorization", "credentials", "key") != key {
		t.Errorf("the ServiceMonitor's authorization %v, want type Bearer with the Secret %s's key %s", get(creds, "authorization"), secret, key)
	}
}

// checkImagesPinned: every outboxd image is tagged with a version
// (vMAJOR.MINOR.PATCH; the per-version Job's placeholder VERSION aside),
// never :latest or untagged.
func checkImagesPinned(t *testing.T, files []string) {
	t.Helper()
	version := regexp.MustCompile(`^ghcr\.io/outboxd/outboxd:(v[0-9]+\.[0-9]+\.[0-9]+|VERSION)$`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllStringSubmatch(string(b), -1) {
			seen++
			if !version.MatchString(m[1]) {
				t.Errorf("%s: image %s, want ghcr.io/outboxd/outboxd:<version> (vMAJOR.MINOR.PATCH, never :latest)", f, m[1])
			}
		}
	}
	if seen == 0 {
		t.Error("no image in the manifests")
	}
}

// checkApplied: file is among kustomization.yaml's resources (kind is
// applied with the rest, not left an example).
func checkApplied(t *testing.T, kind, file string) {
	t.Helper()
	k := docs(t, "kubernetes/kustomization.yaml")[0]
	for _, r := range get(k, "resources").([]any) {
		if r == file {
			return
		}
	}
	t.Errorf("the %s (%s) is not among kustomization.yaml's resources", kind, file)
}
