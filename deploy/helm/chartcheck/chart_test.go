package chartcheck_test

import (
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/outboxd/outboxd/config"
)

// knownKeys is config's key set.
func knownKeys(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k] = true
	}
	return known
}

// backend is one rendering of the chart and what its lease backend makes
// different.
type backend struct {
	name string
	sets []string
	// egress: the TCP ports the NetworkPolicy lets out besides DNS.
	egress []int
	check  func(t *testing.T, r rendered, cfg map[string]any)
}

var etcdSets = []string{
	"lock.backend=etcd",
	"lock.etcd.endpoints={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}",
	"lock.etcd.username=outboxd",
	"lock.etcd.passwordSecret.name=outboxd-etcd-auth",
	"lock.etcd.tls.enabled=true",
	"lock.etcd.tls.secretName=outboxd-etcd-tls",
	"lock.etcd.tls.certFile=tls.crt",
	"lock.etcd.tls.keyFile=tls.key",
}

var backends = []backend{
	{
		name:   "redis (default values)",
		egress: []int{443, 5432, 6379},
		check: func(t *testing.T, _ rendered, cfg map[string]any) {
			t.Helper()
			if get(cfg, "lock", "backend") != "redis" || !slices.Equal(list(cfg, "redis", "addrs"), []any{"redis.outboxd.svc:6379"}) {
				t.Errorf("lock %v, redis %v: want the redis backend at redis.outboxd.svc:6379", get(cfg, "lock"), get(cfg, "redis"))
			}
		},
	},
	{
		name: "redis with a password and TLS",
		sets: []string{
			"redis.addrs={redis-0.redis:6380,redis-1.redis:6380,redis-2.redis:6380}", "redis.mode=redlock",
			"redis.passwordSecret.name=outboxd-redis-auth", "redis.tls.enabled=true", "redis.tls.secretName=outboxd-redis-tls",
		},
		egress: []int{443, 5432, 6380},
		check: func(t *testing.T, _ rendered, cfg map[string]any) {
			t.Helper()
			if get(cfg, "redis", "password_file") == nil || get(cfg, "redis", "tls", "ca_file") == nil || get(cfg, "redis", "tls", "enabled") != true {
				t.Errorf("redis %v: want password_file, tls.enabled and tls.ca_file", get(cfg, "redis"))
			}
		},
	},
	{
		name:   "postgres",
		sets:   []string{"lock.backend=postgres"},
		egress: []int{443, 5432},
		check: func(t *testing.T, r rendered, cfg map[string]any) {
			t.Helper()
			if get(cfg, "lock", "backend") != "postgres" {
				t.Errorf("lock %v, want backend postgres", get(cfg, "lock"))
			}
			// The idempotency store defaults to postgres with this
			// backend: nothing of Redis is configured or mounted.
			if get(cfg, "redis") != nil {
				t.Errorf("config has a redis section %v: with lock.backend postgres no Redis is needed", get(cfg, "redis"))
			}
			if strings.Contains(show(r.one(t, "Deployment")), "redis") {
				t.Error("the Deployment mentions redis with lock.backend postgres")
			}
		},
	},
	{
		name:   "etcd",
		sets:   etcdSets,
		egress: []int{443, 2379, 5432, 6379}, // the marks stay in Redis by default
		check: func(t *testing.T, _ rendered, cfg map[string]any) {
			t.Helper()
			etcd := get(cfg, "lock", "etcd")
			if !slices.Equal(list(etcd, "endpoints"), []any{"https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"}) ||
				get(etcd, "username") != "outboxd" || get(etcd, "password_file") == nil ||
				get(etcd, "tls", "cert_file") == nil || get(etcd, "tls", "key_file") == nil || get(etcd, "tls", "ca_file") == nil {
				t.Errorf("lock.etcd %v: want the endpoints, username, password_file and tls files", etcd)
			}
			if get(cfg, "redis", "addrs") == nil {
				t.Error("no redis.addrs: the idempotency marks default to Redis with etcd")
			}
		},
	},
	{
		name:   "etcd with the idempotency marks in postgres",
		sets:   append(slices.Clone(etcdSets), "idempotency.store=postgres"),
		egress: []int{443, 2379, 5432},
		check: func(t *testing.T, _ rendered, cfg map[string]any) {
			t.Helper()
			if get(cfg, "idempotency", "store") != "postgres" || get(cfg, "redis") != nil {
				t.Errorf("idempotency %v, redis %v: want the store postgres and no redis section", get(cfg, "idempotency"), get(cfg, "redis"))
			}
		},
	},
}

// Every lease backend renders, passes values.schema.json, and yields pods
// that probe /livez and /readyz on the port http.addr serves, read every
// secret as a file from a Secret, migrate with the migration role's DSN,
// let the lease's servers through the NetworkPolicy and are scraped with
// the operations token.
func TestChartRendersEveryLeaseBackend(t *testing.T) {
	t.Parallel()
	known := knownKeys(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			r := mustRender(t, values(t, append([]string{"serviceMonitor.enabled=true"}, b.sets...)...))
			cfg := configOf(t, r)
			flat := map[string]any{}
			leaves(cfg, "", known, flat)
			for k := range flat {
				if !known[k] {
					t.Errorf("config.yaml sets %s, which is no config key", k)
				}
			}
			checkPod(t, r, flat)
			checkPorts(t, r, flat)
			checkSecretFiles(t, r, flat)
			checkMigrate(t, r)
			checkToken(t, r, flat)
			if got := egressPorts(r.one(t, "NetworkPolicy")); !slices.Equal(got, b.egress) {
				t.Errorf("NetworkPolicy lets out TCP ports %v, want %v", got, b.egress)
			}
			b.check(t, r, cfg)
		})
	}
}

// checkPod: replicas, the PDB below them, probes on /livez and /readyz at
// the named port http; the grace period outlasts shutdown_timeout.
func checkPod(t *testing.T, r rendered, flat map[string]any) {
	t.Helper()
	dep := r.one(t, "Deployment")
	pod := get(dep, "spec", "template", "spec")
	ctr := container(t, pod, "containers", "outboxd")
	if get(dep, "spec", "replicas") != 3 || get(r.one(t, "PodDisruptionBudget"), "spec", "minAvailable") != 2 {
		t.Errorf("replicas %v, PDB minAvailable %v: want 3 and 2", get(dep, "spec", "replicas"), get(r.one(t, "PodDisruptionBudget"), "spec", "minAvailable"))
	}
	for probe, want := range map[string]string{"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"} {
		if get(ctr, probe, "httpGet", "path") != want || get(ctr, probe, "httpGet", "port") != "http" {
			t.Errorf("%s %v, want GET %s on port http", probe, get(ctr, probe), want)
		}
	}
	grace := time.Duration(get(pod, "terminationGracePeriodSeconds").(int)) * time.Second
	shutdown, err := time.ParseDuration(flat["shutdown_timeout"].(string))
	if err != nil || grace <= shutdown+2*time.Second {
		t.Errorf("terminationGracePeriodSeconds %s must exceed shutdown_timeout %v plus the lock release (%v)", grace, flat["shutdown_timeout"], err)
	}
}

// checkPorts: the container's port http is http.addr's port, the
// Service's target and the port the NetworkPolicy admits to the relay's
// pods.
func checkPorts(t *testing.T, r rendered, flat map[string]any) {
	t.Helper()
	dep := r.one(t, "Deployment")
	ctr := container(t, get(dep, "spec", "template", "spec"), "containers", "outboxd")
	_, portText, err := net.SplitHostPort(flat["http.addr"].(string))
	if err != nil {
		t.Fatalf("http.addr %v: %v", flat["http.addr"], err)
	}
	port, _ := strconv.Atoi(portText)
	ports := list(ctr, "ports")
	if len(ports) != 1 || get(ports[0], "name") != "http" || get(ports[0], "containerPort") != port {
		t.Errorf("container ports %v, want http on http.addr's port %d", ports, port)
	}
	svc := list(r.one(t, "Service"), "spec", "ports")
	if len(svc) != 1 || get(svc[0], "targetPort") != "http" || get(svc[0], "name") != "http" {
		t.Errorf("Service ports %v, want http to the container's http", svc)
	}
	in := list(r.one(t, "NetworkPolicy"), "spec", "ingress")
	if len(in) != 1 || get(list(in[0], "ports")[0], "port") != port {
		t.Errorf("NetworkPolicy ingress %v, want port %d", in, port)
	}
	for k, v := range get(r.one(t, "NetworkPolicy"), "spec", "podSelector", "matchLabels").(map[string]any) {
		if get(dep, "spec", "template", "metadata", "labels", k) != v {
			t.Errorf("the NetworkPolicy selects %s=%v, which the relay's pods lack", k, v)
		}
	}
}

// checkSecretFiles: every *_file key names a file in a directory the relay
// container mounts from a Secret.
func checkSecretFiles(t *testing.T, r rendered, flat map[string]any) {
	t.Helper()
	pod := get(r.one(t, "Deployment"), "spec", "template", "spec")
	ctr := container(t, pod, "containers", "outboxd")
	files := 0
	for k, v := range flat {
		if !strings.HasSuffix(k, "_file") {
			continue
		}
		files++
		file, _ := v.(string)
		vol := mountOf(pod, ctr, file)
		if get(vol, "secret", "secretName") == nil {
			t.Errorf("%s %q is not in a directory the relay container mounts from a Secret", k, file)
		}
	}
	if files < 3 { // postgres.dsn_file, the webhook's secret_file, http.auth_token_file
		t.Errorf("%d *_file keys in %v, want at least 3", files, flat)
	}
}

// checkMigrate: one init container runs migrate with the relay's image and
// the migration role's DSN, from a Secret the relay container never mounts.
func checkMigrate(t *testing.T, r rendered) {
	t.Helper()
	pod := get(r.one(t, "Deployment"), "spec", "template", "spec")
	ctr := container(t, pod, "containers", "outboxd")
	inits := list(pod, "initContainers")
	if len(inits) != 1 || get(inits[0], "image") != get(ctr, "image") || list(inits[0], "args")[0] != "migrate" {
		t.Fatalf("want one init container running migrate with the relay's image, got %v", inits)
	}
	var dsnFile any
	for _, e := range list(inits[0], "env") {
		if get(e, "name") == "OUTBOXD_POSTGRES_DSN_FILE" {
			dsnFile = get(e, "value")
		}
	}
	file, _ := dsnFile.(string)
	vol := mountOf(pod, inits[0], file)
	secret := get(vol, "secret", "secretName")
	if secret == nil {
		t.Fatalf("the init container's OUTBOXD_POSTGRES_DSN_FILE %v is not in a Secret it mounts", dsnFile)
	}
	for _, m := range list(ctr, "volumeMounts") {
		if get(m, "name") == get(vol, "name") {
			t.Errorf("the relay container mounts the migration role's Secret %v", secret)
		}
	}
}

// checkToken: http.auth_token_file is the key of the Secret the
// ServiceMonitor sends as its bearer token, and the chart's own token
// Secret holds that key.
func checkToken(t *testing.T, r rendered, flat map[string]any) {
	t.Helper()
	pod := get(r.one(t, "Deployment"), "spec", "template", "spec")
	file, _ := flat["http.auth_token_file"].(string)
	secret := get(mountOf(pod, container(t, pod, "containers", "outboxd"), file), "secret", "secretName")
	key := path.Base(file)
	auth := get(list(r.one(t, "ServiceMonitor"), "spec", "endpoints")[0], "authorization")
	if secret == nil || get(auth, "type") != "Bearer" || get(auth, "credentials", "name") != secret || get(auth, "credentials", "key") != key {
		t.Errorf("ServiceMonitor authorization %v, want Bearer with the Secret %v's key %s (http.auth_token_file %s)", auth, secret, key, file)
	}
	s := r.named("Secret", secret.(string))
	if s == nil || get(s, "data", key) == nil {
		t.Errorf("the chart's token Secret %v has no key %s", s, key)
	}
}

// Values the schema or the templates refuse, each with the words of its
// refusal.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		sets []string
		want string
	}{
		{"an unknown lease backend", []string{"lock.backend=zookeeper"}, "/lock/backend"},
		{"etcd without endpoints", []string{"lock.backend=etcd"}, "/lock/etcd/endpoints"},
		{"redis without addresses", []string{"redis.addrs=null"}, "missing property 'addrs'"},
		{"marks in Redis without addresses", []string{"lock.backend=postgres", "idempotency.store=redis", "redis.addrs=null"}, "redis.addrs: lock.backend postgres"},
		{"a PDB that blocks every drain", []string{"replicaCount=2"}, "podDisruptionBudget.minAvailable 2 must be below replicaCount 2"},
		{"the image's latest tag", []string{"image.tag=latest"}, "/image/tag"},
		{"a key the chart manages, in config", []string{"config.http.addr=0.0.0.0:8080"}, "/config/http/addr"},
		{"a misspelt value", []string{"lock.backends=etcd"}, "'backends' not allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(values(t, c.sets...))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("render with %v: error %v, want one naming %q", c.sets, err, c.want)
			}
		})
	}
}

// `helm lint --strict` finds nothing, for every lease backend.
func TestChartLints(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		lint := action.NewLint()
		lint.Strict, lint.Namespace = true, namespace
		res := lint.Run([]string{chartDir}, values(t, b.sets...))
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %s", b.name, m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("%s: helm lint: %v", b.name, err)
		}
	}
}
