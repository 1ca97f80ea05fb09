package chartcheck_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// helmOnly are the labels and annotations only a Helm release carries: the
// release's name in selectors, who manages it, the chart's version, the
// config's checksum that rolls the pods when config.yaml changes.
var helmOnly = []string{
	"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version",
	"helm.sh/chart", "checksum/config",
}

// plainKinds are the kinds the chart and deploy/kubernetes both make; the
// Namespace (`helm install --create-namespace`), the example Secrets and
// the per-version migrate Job are the plain manifests' alone, the token
// Secret the chart makes is the chart's alone.
var plainKinds = []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "ServiceAccount", "ServiceMonitor"}

// The plain manifests are the chart rendered with its default values (and
// the ServiceMonitor on) for a release named outboxd: the same objects,
// field for field, once comments, the namespace and Helm's own labels are
// set aside. Change the chart and deploy/kubernetes together.
func TestPlainManifestsEqualTheChart(t *testing.T) {
	t.Parallel()
	chart := map[string]map[string]any{}
	for _, o := range mustRender(t, values(t, "serviceMonitor.enabled=true")) {
		if slices.Contains(plainKinds, o["kind"].(string)) {
			chart[id(o)] = normalize(t, o)
		}
	}
	plain := map[string]map[string]any{}
	files, err := filepath.Glob(filepath.Join(plainDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no plain manifests in %s (%v)", plainDir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			if k, _ := o["kind"].(string); slices.Contains(plainKinds, k) {
				plain[id(o)] = normalize(t, o)
			}
		}
	}
	for name, want := range chart {
		got, ok := plain[name]
		switch {
		case !ok:
			t.Errorf("the chart makes %s, which deploy/kubernetes lacks", name)
		case !reflect.DeepEqual(got, want):
			t.Errorf("%s differs.\ndeploy/kubernetes:\n%s\nthe chart:\n%s", name, show(got), show(want))
		}
	}
	for name := range plain {
		if chart[name] == nil {
			t.Errorf("deploy/kubernetes has %s, which the chart does not make", name)
		}
	}
}

func id(o map[string]any) string {
	name, _ := get(o, "metadata", "name").(string)
	return o["kind"].(string) + "/" + name
}

// normalize sets aside what the plain manifests and the chart may differ
// in: the namespace (kustomization.yaml sets it), Helm's labels and
// annotations, and the ConfigMap's config.yaml text (compared parsed).
func normalize(t *testing.T, o map[string]any) map[string]any {
	t.Helper()
	if md, ok := o["metadata"].(map[string]any); ok {
		delete(md, "namespace")
	}
	if text, ok := get(o, "data", "config.yaml").(string); ok {
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
			t.Fatalf("%s: config.yaml: %v", id(o), err)
		}
		o["data"].(map[string]any)["config.yaml"] = cfg
	}
	dropHelmOnly(o)
	return o
}

func dropHelmOnly(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if slices.Contains(helmOnly, k) {
				delete(v, k)
				continue
			}
			dropHelmOnly(x)
		}
	case []any:
		for _, x := range v {
			dropHelmOnly(x)
		}
	}
}
