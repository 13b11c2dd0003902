package validate

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

const k8sDir = "../k8s"

// The Prometheus Operator's types are not in k8s.io/api: these local
// structs hold the fields the manifests use, and strict decoding refuses any
// other (a typo, or a field the operator does not have).

type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		JobLabel  string `json:"jobLabel,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			HonorLabels   bool   `json:"honorLabels,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type ruleGroups struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleGroups `json:"spec"`
}

type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Resources       []string `json:"resources"`
}

// manifests is every object in deploy/k8s, decoded.
type manifests struct {
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	services        map[string]*corev1.Service
	deployments     map[string]*appsv1.Deployment
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	pdbs            map[string]*policyv1.PodDisruptionBudget
	ingresses       map[string]*networkingv1.Ingress
	netPolicies     map[string]*networkingv1.NetworkPolicy
	serviceMonitors map[string]*serviceMonitor
	prometheusRules map[string]*prometheusRule
	kustomization   *kustomization
	files           map[string][]string // file -> kinds
}

// documents splits a multi-document YAML file.
func documents(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(stripComments(cur.Bytes()))) > 0 {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimRight(line, " \r\n"); string(t) == "---" {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func strict(t *testing.T, where string, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
}

func put[T any](t *testing.T, m map[string]T, name, where string, v T) {
	t.Helper()
	if _, dup := m[name]; dup {
		t.Errorf("%s: a second object named %q of this kind", where, name)
	}
	m[name] = v
}

// decodeNamed returns a decoder of one kind of object: it decodes a
// document strictly into a new object, files it under its name in m and
// checks its metadata.
func decodeNamed[E any, P interface {
	*E
	metav1.Object
}](t *testing.T, m map[string]P) func(where string, doc []byte) {
	return func(where string, doc []byte) {
		t.Helper()
		o := P(new(E))
		strict(t, where, doc, o)
		put(t, m, o.GetName(), where, o)
		checkMeta(t, where, o)
	}
}

func load(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		services: map[string]*corev1.Service{}, deployments: map[string]*appsv1.Deployment{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		ingresses: map[string]*networkingv1.Ingress{}, netPolicies: map[string]*networkingv1.NetworkPolicy{},
		serviceMonitors: map[string]*serviceMonitor{},
		prometheusRules: map[string]*prometheusRule{}, files: map[string][]string{},
	}
	// decoders decode a document of each kind (by apiVersion/kind) into m.
	decoders := map[string]func(where string, doc []byte){
		"v1/ConfigMap":                            decodeNamed(t, m.configMaps),
		"v1/Secret":                               decodeNamed(t, m.secrets),
		"v1/Service":                              decodeNamed(t, m.services),
		"apps/v1/Deployment":                      decodeNamed(t, m.deployments),
		"autoscaling/v2/HorizontalPodAutoscaler":  decodeNamed(t, m.hpas),
		"policy/v1/PodDisruptionBudget":           decodeNamed(t, m.pdbs),
		"networking.k8s.io/v1/Ingress":            decodeNamed(t, m.ingresses),
		"networking.k8s.io/v1/NetworkPolicy":      decodeNamed(t, m.netPolicies),
		"monitoring.coreos.com/v1/ServiceMonitor": decodeNamed(t, m.serviceMonitors),
		"monitoring.coreos.com/v1/PrometheusRule": decodeNamed(t, m.prometheusRules),
	}
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Base(path)
		for i, doc := range documents(data) {
			where := fmt.Sprintf("%s[%d]", base, i)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			m.files[base] = append(m.files[base], tm.Kind)
			gvk := tm.APIVersion + "/" + tm.Kind
			if gvk == "kustomize.config.k8s.io/v1beta1/Kustomization" {
				m.kustomization = &kustomization{}
				strict(t, where, doc, m.kustomization)
				continue
			}
			decode, ok := decoders[gvk]
			if !ok {
				t.Fatalf("%s: unexpected kind %s", where, gvk)
			}
			decode(where, doc)
		}
	}
	return m
}

func checkMeta(t *testing.T, where string, meta metav1.Object) {
	t.Helper()
	for _, e := range validation.IsDNS1123Subdomain(meta.GetName()) {
		t.Errorf("%s: metadata.name %q: %s", where, meta.GetName(), e)
	}
	checkLabels(t, where+": metadata.labels", meta.GetLabels())
	for k := range meta.GetAnnotations() {
		for _, e := range validation.IsQualifiedName(k) {
			t.Errorf("%s: annotation %q: %s", where, k, e)
		}
	}
}

func checkLabels(t *testing.T, where string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			t.Errorf("%s: key %q: %s", where, k, e)
		}
		for _, e := range validation.IsValidLabelValue(v) {
			t.Errorf("%s: value %q: %s", where, v, e)
		}
	}
}

// selects reports whether a label selector matches a set of labels.
func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

func one[T any](t *testing.T, kind string, m map[string]T) T {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("want exactly one %s, have %d", kind, len(m))
	}
	for _, v := range m {
		return v
	}
	panic("unreachable")
}

// agentConfig is the part of an agent's settings (agent:, or one of
// agents:) the manifests depend on.
type agentConfig struct {
	StopGrace  string   `json:"stop_grace"`
	InheritEnv []string `json:"inherit_env"`
	Sandbox    struct {
		ReadOnly  []string `json:"read_only"`
		ReadWrite []string `json:"read_write"`
	} `json:"sandbox"`
}

// gatewayConfig is the part of acpgate.yaml the manifests depend on.
// (acpgate check-config, run by test/ops, validates the whole file.)
type gatewayConfig struct {
	Listen        string                 `json:"listen"`
	ShutdownGrace string                 `json:"shutdown_grace"`
	ShutdownDelay string                 `json:"shutdown_delay"`
	Agent         agentConfig            `json:"agent"`
	Agents        map[string]agentConfig `json:"agents"`
	WebSocket     struct {
		PingInterval string `json:"ping_interval"`
	} `json:"websocket"`
	Observability struct {
		MetricsListen string `json:"metrics_listen"`
	} `json:"observability"`
	Tenants []struct {
		Root string `json:"root"`
	} `json:"tenants"`
	Sandbox struct {
		Mode      string   `json:"mode"`
		Home      string   `json:"home"`
		ReadOnly  []string `json:"read_only"`
		ReadWrite []string `json:"read_write"`
	} `json:"sandbox"`
	SessionKeyFile  string   `json:"session_key_file"`
	SessionKeyFiles []string `json:"session_key_files"`
	Sessions        struct {
		AffinityCookie string `json:"affinity_cookie"`
	} `json:"sessions"`
	Cluster *struct {
		Name      string `json:"name"`
		Store     string `json:"store"`
		Listen    string `json:"listen"`
		Advertise string `json:"advertise"`
		KeyFile   string `json:"key_file"`
		Lease     string `json:"lease"`
	} `json:"cluster"`
}

// gatewayName names the gateway's Deployment and Service (the others are
// its cluster store's).
const gatewayName = "acpgate"

func gateway(t *testing.T, m *manifests) (*appsv1.Deployment, *corev1.Service) {
	t.Helper()
	d, okD := m.deployments[gatewayName]
	svc, okS := m.services[gatewayName]
	if !okD || !okS {
		t.Fatalf("no Deployment and Service named %q", gatewayName)
	}
	return d, svc
}

// agents lists the agents the gateway runs, each with its effective
// settings: the named agents (their unset keys from agent:), or agent:
// alone, named "default".
func (c *gatewayConfig) agents() map[string]agentConfig {
	if len(c.Agents) == 0 {
		return map[string]agentConfig{"default": c.Agent}
	}
	out := map[string]agentConfig{}
	for name, a := range c.Agents {
		if a.StopGrace == "" {
			a.StopGrace = c.Agent.StopGrace
		}
		if a.InheritEnv == nil {
			a.InheritEnv = c.Agent.InheritEnv
		}
		out[name] = a
	}
	return out
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	dir = strings.TrimSuffix(dir, "/")
	return path == dir || strings.HasPrefix(path, dir+"/")
}

func duration(t *testing.T, what, s, def string) time.Duration {
	t.Helper()
	if s == "" {
		s = def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return d
}

func port(t *testing.T, what, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	var n int32
	if _, err := fmt.Sscan(p, &n); err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	return n
}

// mountFor returns the volume mount holding path, or nil.
func mountFor(c corev1.Container, path string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if path == vm.MountPath || strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			if best == nil || len(vm.MountPath) > len(best.MountPath) {
				best = &c.VolumeMounts[i]
			}
		}
	}
	return best
}

func volume(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func containerPort(c corev1.Container, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := load(t)
	var files []string
	for f, kinds := range m.files {
		files = append(files, fmt.Sprintf("%s: %s", f, strings.Join(kinds, ", ")))
	}
	sort.Strings(files)
	t.Logf("decoded:\n  %s", strings.Join(files, "\n  "))
	// Two Deployments, Services and NetworkPolicies: the gateway's and
	// its cluster store's (redis.yaml).
	for _, want := range []struct {
		kind    string
		n, want int
	}{{"ConfigMap", len(m.configMaps), 1}, {"Secret", len(m.secrets), 1}, {"Service", len(m.services), 2},
		{"Deployment", len(m.deployments), 2}, {"HorizontalPodAutoscaler", len(m.hpas), 1},
		{"PodDisruptionBudget", len(m.pdbs), 1}, {"Ingress", len(m.ingresses), 1}, {"NetworkPolicy", len(m.netPolicies), 2},
		{"ServiceMonitor", len(m.serviceMonitors), 1}, {"PrometheusRule", len(m.prometheusRules), 1}} {
		if want.n != want.want {
			t.Errorf("want %d %s, have %d", want.want, want.kind, want.n)
		}
	}
}

// TestStrictDecodingCatchesMistakes makes sure the checks above would catch
// a misspelt field and a duplicate key.
func TestStrictDecodingCatchesMistakes(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selectr: {a: b}\n",
		"duplicate key": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  type: ClusterIP\n  type: NodePort\n",
		"bad quantity":  "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: c, resources: {limits: {memory: lots}}}]\n",
	} {
		var into any = &corev1.Service{}
		if strings.Contains(doc, "Pod") {
			into = &corev1.Pod{}
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func TestDeployment(t *testing.T) {
	m := load(t)
	d, _ := gateway(t, m)
	spec := d.Spec.Template.Spec
	checkPod(t, m, d)

	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	// Probes: paths are checked against a running gateway by test/ops; here
	// that they point at a declared port and the right endpoints.
	probes := map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	for name, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet probe", name)
			continue
		}
		if _, ok := containerPort(c, p.HTTPGet.Port); !ok {
			t.Errorf("%s probe: port %s is not a container port", name, p.HTTPGet.Port.String())
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe path %q, want /healthz (/readyz fails while agents cannot start, which a restart does not cure)", c.LivenessProbe.HTTPGet.Path)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe path %q, want /readyz", c.ReadinessProbe.HTTPGet.Path)
	}
	cfg := gatewayCfg(t, m, d)
	testDeploymentConfig(t, m, d, cfg)
}

// checkPod checks a Deployment's selector, labels and pod security: every
// container non-root, read-only, unprivileged, with resources, and what
// it mounts and takes from Secrets in deploy/k8s.
func checkPod(t *testing.T, m *manifests, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if !selects(t, d.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Deployment %s: the selector %v does not match its pod labels %v", d.Name, d.Spec.Selector, d.Spec.Template.Labels)
	}
	checkLabels(t, "pod template labels", d.Spec.Template.Labels)

	// Pod security.
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod securityContext.runAsNonRoot must be true")
	}
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("pod securityContext.runAsUser must be a non-zero uid (the image's USER is numeric)")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod securityContext.seccompProfile must be RuntimeDefault")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken must be false: agents run tools for remote users")
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("enableServiceLinks must be false: a Service named acpgate injects ACPGATE_* variables")
	}
	all := append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("container %s: no securityContext", c.Name)
			continue
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("container %s: readOnlyRootFilesystem must be true", c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("container %s: allowPrivilegeEscalation must be false", c.Name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			t.Errorf("container %s: capabilities must drop ALL and add none", c.Name)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("container %s: privileged", c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := c.Resources.Requests[r]
			lim, okLim := c.Resources.Limits[r]
			if !okReq || !okLim {
				t.Errorf("container %s: needs a %s request and limit", c.Name, r)
			} else if req.Cmp(lim) > 0 {
				t.Errorf("container %s: %s request %s above its limit %s", c.Name, r, req.String(), lim.String())
			}
		}
		for _, vm := range c.VolumeMounts {
			if volume(spec, vm.Name) == nil {
				t.Errorf("container %s: mounts undeclared volume %q", c.Name, vm.Name)
			}
		}
		for _, e := range c.Env {
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
				s, ok := m.secrets[ref.SecretKeyRef.Name]
				if !ok {
					t.Errorf("container %s: env %s names Secret %q, not in deploy/k8s", c.Name, e.Name, ref.SecretKeyRef.Name)
				} else if _, ok := s.StringData[ref.SecretKeyRef.Key]; !ok {
					t.Errorf("container %s: env %s names key %q, not in the example Secret", c.Name, e.Name, ref.SecretKeyRef.Key)
				}
			}
		}
	}

}

// gatewayCfg is the gateway's configuration: the --config path is in a
// ConfigMap volume holding that key.
func gatewayCfg(t *testing.T, m *manifests, d *appsv1.Deployment) gatewayConfig {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("container args %v: no --config FILE", c.Args)
	}
	cfgPath := c.Args[i+1]
	vm := mountFor(c, cfgPath)
	if vm == nil {
		t.Fatalf("--config %s is on no volume", cfgPath)
	}
	v := volume(spec, vm.Name)
	if v.ConfigMap == nil {
		t.Fatalf("--config %s: volume %q is not a ConfigMap", cfgPath, vm.Name)
	}
	cm, ok := m.configMaps[v.ConfigMap.Name]
	if !ok {
		t.Fatalf("volume %q names ConfigMap %q, not in deploy/k8s", vm.Name, v.ConfigMap.Name)
	}
	key := strings.TrimPrefix(cfgPath, strings.TrimSuffix(vm.MountPath, "/")+"/")
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %q has no key %q for --config %s", cm.Name, key, cfgPath)
	}
	var cfg gatewayConfig
	if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatalf("ConfigMap %s/%s: %v", cm.Name, key, err)
	}
	return cfg
}

func testDeploymentConfig(t *testing.T, m *manifests, d *appsv1.Deployment, cfg gatewayConfig) {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]

	// Shutdown: the kubelet's SIGKILL must come after the gateway's own
	// bound on a drain (shutdown_delay + shutdown_grace + the longest
	// stop_grace + 5s).
	agents := cfg.agents()
	var stopGrace time.Duration
	for name, a := range agents {
		stopGrace = max(stopGrace, duration(t, "agents."+name+".stop_grace", a.StopGrace, "5s"))
	}
	delay := duration(t, "shutdown_delay", cfg.ShutdownDelay, "0s")
	bound := delay + duration(t, "shutdown_grace", cfg.ShutdownGrace, "30s") + stopGrace + 5*time.Second
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= bound {
		t.Errorf("terminationGracePeriodSeconds must exceed shutdown_delay + shutdown_grace + stop_grace + 5s = %s", bound)
	}
	// Rollout: while the gateway is not ready but still accepting
	// (shutdown_delay), the readiness probe must fail enough times for the
	// endpoint to be removed, so that no new client meets a closed port.
	if rp := c.ReadinessProbe; rp != nil {
		need := time.Duration(rp.PeriodSeconds*max(rp.FailureThreshold, 1)) * time.Second
		if delay < need {
			t.Errorf("shutdown_delay %s is shorter than the readiness probe's periodSeconds × failureThreshold = %s: "+
				"the endpoint would still be listed when the listener closes", delay, need)
		}
	}

	// Agents' environment: a sandboxed agent (the sandbox is on by default
	// with tenants) gets only the variables its inherit_env names. Each one
	// an agent names beyond the usual ones must be set in the container,
	// and each variable the container takes from a Secret (an API key) must
	// reach some agent.
	sandboxOn := cfg.Sandbox.Mode != "off" && (cfg.Sandbox.Mode != "" || len(cfg.Tenants) > 0)
	if sandboxOn {
		container := map[string]bool{}
		for _, e := range c.Env {
			container[e.Name] = true
		}
		inherited := map[string]bool{}
		for name, a := range agents {
			for _, v := range a.InheritEnv {
				inherited[v] = true
				if !container[v] && !slices.Contains([]string{"PATH", "LANG", "LC_ALL", "TZ", "TERM"}, v) {
					t.Errorf("agent %s: inherit_env names %s, which the container does not set", name, v)
				}
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !inherited[e.Name] {
				t.Errorf("env %s comes from a Secret but no agent's inherit_env names it: a sandboxed agent never sees it", e.Name)
			}
		}
	}
	if lc := c.Lifecycle; lc != nil && lc.PreStop != nil && lc.PreStop.Exec != nil {
		t.Errorf("a preStop exec hook cannot run in the distroless image (no shell)")
	}

	// Ports: listen and metrics_listen are the container's ports.
	if p, ok := containerPort(c, intstr.FromString("http")); !ok || p.ContainerPort != port(t, "listen", cfg.Listen) {
		t.Errorf("container port http (%d) is not the listen port of %q", p.ContainerPort, cfg.Listen)
	}
	if cfg.Observability.MetricsListen == "" {
		t.Error("observability.metrics_listen is unset: /metrics would be served through the Ingress")
	} else if p, ok := containerPort(c, intstr.FromString("metrics")); !ok || p.ContainerPort != port(t, "metrics_listen", cfg.Observability.MetricsListen) {
		t.Errorf("container port metrics (%d) is not the port of metrics_listen %q", p.ContainerPort, cfg.Observability.MetricsListen)
	}
	if h, _, _ := net.SplitHostPort(cfg.Listen); h == "127.0.0.1" || h == "localhost" {
		t.Errorf("listen %q is loopback: the kubelet and the Service cannot reach it", cfg.Listen)
	}

	// Session keys come from a Secret volume that holds them.
	for _, f := range append([]string{cfg.SessionKeyFile}, cfg.SessionKeyFiles...) {
		if f == "" {
			continue
		}
		vm := mountFor(c, f)
		if vm == nil {
			t.Errorf("session key %s is on no volume", f)
			continue
		}
		v := volume(spec, vm.Name)
		if v.Secret == nil {
			t.Errorf("session key %s: volume %q is not a Secret", f, vm.Name)
			continue
		}
		s, ok := m.secrets[v.Secret.SecretName]
		if !ok {
			t.Errorf("volume %q names Secret %q, not in deploy/k8s", vm.Name, v.Secret.SecretName)
			continue
		}
		name := strings.TrimPrefix(f, strings.TrimSuffix(vm.MountPath, "/")+"/")
		keyOK := false
		for _, it := range v.Secret.Items {
			if it.Path == name {
				_, keyOK = s.StringData[it.Key]
			}
		}
		if len(v.Secret.Items) == 0 {
			_, keyOK = s.StringData[name]
		}
		if !keyOK {
			t.Errorf("session key %s: the Secret volume does not provide %q", f, name)
		}
	}
	if cfg.SessionKeyFile == "" && len(cfg.SessionKeyFiles) == 0 {
		t.Error("no session_key_file: replicas would seal session IDs with different random keys")
	}

	// Tenant roots are on a writable volume and created before start.
	var initCmd []string
	for _, ic := range spec.InitContainers {
		initCmd = append(initCmd, ic.Command...)
		initCmd = append(initCmd, ic.Args...)
	}
	for _, tn := range cfg.Tenants {
		vm := mountFor(c, tn.Root)
		if vm == nil || vm.ReadOnly {
			t.Errorf("tenant root %s is not on a writable volume", tn.Root)
		}
		if !slices.Contains(initCmd, tn.Root) {
			t.Errorf("tenant root %s is not created by an init container (the gateway refuses a missing root)", tn.Root)
		}
	}
	if mountFor(c, "/tmp") == nil {
		t.Error("no volume at /tmp: the root file system is read-only")
	}

	// The agent sandbox (on by default with tenants): each tenant's agents
	// get a home under sandbox.home, which must be writable on a read-only
	// root file system and lie outside every tenant root; no ConfigMap or
	// Secret volume may lie where agents can read (check-config checks the
	// key files it names, this every mounted secret).
	if sandboxOn {
		home := cfg.Sandbox.Home
		if home == "" {
			home = "/var/lib/acpgate/homes" // the gateway's default
		}
		if vm := mountFor(c, home); vm == nil || vm.ReadOnly {
			t.Errorf("sandbox.home %s is not on a writable volume (the root file system is read-only)", home)
		} else if v := volume(spec, vm.Name); v.ConfigMap != nil || v.Secret != nil || v.Projected != nil {
			t.Errorf("sandbox.home %s is on volume %q, which is not writable storage", home, vm.Name)
		}
		agentPaths := append(append([]string{home}, cfg.Sandbox.ReadOnly...), cfg.Sandbox.ReadWrite...)
		for _, a := range agents {
			agentPaths = append(append(agentPaths, a.Sandbox.ReadOnly...), a.Sandbox.ReadWrite...)
		}
		for _, tn := range cfg.Tenants {
			if within(home, tn.Root) || within(tn.Root, home) {
				t.Errorf("sandbox.home %s and tenant root %s overlap", home, tn.Root)
			}
			agentPaths = append(agentPaths, tn.Root)
		}
		for _, vm := range c.VolumeMounts {
			v := volume(spec, vm.Name)
			if v == nil || (v.Secret == nil && v.ConfigMap == nil && v.Projected == nil) {
				continue
			}
			for _, p := range agentPaths {
				if within(vm.MountPath, p) || within(p, vm.MountPath) {
					t.Errorf("secret or configuration volume %q at %s overlaps %s, which agents may use under the sandbox", vm.Name, vm.MountPath, p)
				}
			}
		}
	}
	if ing := one(t, "Ingress", m.ingresses); ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] != "" {
		var s int
		_, _ = fmt.Sscan(ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"], &s)
		if ping := duration(t, "websocket.ping_interval", cfg.WebSocket.PingInterval, "30s"); ping == 0 || time.Duration(s)*time.Second <= ping {
			t.Errorf("ingress proxy-read-timeout %ds must exceed websocket.ping_interval %s", s, ping)
		}
	}
}

func TestServiceAndFriends(t *testing.T) {
	m := load(t)
	d, svc := gateway(t, m)
	c := d.Spec.Template.Spec.Containers[0]
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, d.Spec.Template.Labels) {
		t.Errorf("Service selector %v does not select the Deployment's pods %v", svc.Spec.Selector, d.Spec.Template.Labels)
	}
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = p
		if _, ok := containerPort(c, p.TargetPort); !ok {
			t.Errorf("Service port %s: targetPort %s is not a container port", p.Name, p.TargetPort.String())
		}
	}

	hpa := one(t, "HorizontalPodAutoscaler", m.hpas)
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != d.Name {
		t.Errorf("HPA scales %+v, not the Deployment %q", ref, d.Name)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas < *hpa.Spec.MinReplicas {
		t.Errorf("HPA replicas %v..%d: want at least 2, max >= min", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	for _, mt := range hpa.Spec.Metrics {
		if mt.Type == autoscalingv2.ResourceMetricSourceType && mt.Resource != nil {
			if _, ok := c.Resources.Requests[mt.Resource.Name]; !ok {
				t.Errorf("HPA scales on %s utilization but the container requests no %s", mt.Resource.Name, mt.Resource.Name)
			}
		}
	}

	pdb := one(t, "PodDisruptionBudget", m.pdbs)
	if !selects(t, pdb.Spec.Selector, d.Spec.Template.Labels) {
		t.Error("the PodDisruptionBudget does not select the Deployment's pods")
	}
	if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
		t.Error("the PodDisruptionBudget sets neither minAvailable nor maxUnavailable")
	}

	sm := one(t, "ServiceMonitor", m.serviceMonitors)
	if !selects(t, &sm.Spec.Selector, svc.Labels) {
		t.Errorf("ServiceMonitor selector does not select the Service's labels %v", svc.Labels)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Error("ServiceMonitor has no endpoints")
	}
	for _, ep := range sm.Spec.Endpoints {
		if _, ok := svcPorts[ep.Port]; !ok {
			t.Errorf("ServiceMonitor endpoint port %q is not a Service port", ep.Port)
		}
		if ep.Path != "" && ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor path %q, want /metrics", ep.Path)
		}
		iv := duration(t, "interval", ep.Interval, "30s")
		if to := duration(t, "scrapeTimeout", ep.ScrapeTimeout, "10s"); to > iv {
			t.Errorf("ServiceMonitor scrapeTimeout %s above interval %s", to, iv)
		}
	}

	ing := one(t, "Ingress", m.ingresses)
	// Affinity: none in cluster mode (TestCluster); without it, cookie
	// affinity, its cookie named by sessions.affinity_cookie.
	if cfg := gatewayCfg(t, m, d); cfg.Cluster == nil {
		for k, want := range map[string]string{
			"nginx.ingress.kubernetes.io/affinity":      "cookie",
			"nginx.ingress.kubernetes.io/affinity-mode": "persistent",
		} {
			if ing.Annotations[k] != want {
				t.Errorf("Ingress annotation %s = %q, want %q (no cluster: block: the replicas need affinity)", k, ing.Annotations[k], want)
			}
		}
		if ing.Annotations["nginx.ingress.kubernetes.io/session-cookie-name"] == "" {
			t.Error("Ingress lacks nginx.ingress.kubernetes.io/session-cookie-name (no cluster: block: the replicas need affinity)")
		}
	}
	for _, k := range []string{"proxy-read-timeout", "proxy-send-timeout"} {
		if ing.Annotations["nginx.ingress.kubernetes.io/"+k] == "" {
			t.Errorf("Ingress lacks nginx.ingress.kubernetes.io/%s", k)
		}
	}
	for _, r := range ing.Spec.Rules {
		for _, e := range validation.IsDNS1123Subdomain(r.Host) {
			t.Errorf("Ingress host %q: %s", r.Host, e)
		}
		for _, p := range r.HTTP.Paths {
			if p.PathType == nil || (*p.PathType != networkingv1.PathTypePrefix && *p.PathType != networkingv1.PathTypeExact) {
				t.Errorf("Ingress path %s: pathType must be Prefix or Exact", p.Path)
			}
			b := p.Backend.Service
			if b == nil || b.Name != svc.Name {
				t.Errorf("Ingress path %s does not route to Service %q", p.Path, svc.Name)
				continue
			}
			sp, ok := svcPorts[b.Port.Name]
			if b.Port.Name == "" {
				for _, x := range svc.Spec.Ports {
					if x.Port == b.Port.Number {
						sp, ok = x, true
					}
				}
			}
			if !ok {
				t.Errorf("Ingress path %s: Service %q has no port %+v", p.Path, svc.Name, b.Port)
			} else if sp.Name == "metrics" {
				t.Errorf("Ingress path %s exposes the metrics port", p.Path)
			}
		}
	}
}

func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	m := load(t)
	pr := one(t, "PrometheusRule", m.prometheusRules)
	data, err := os.ReadFile("../prometheus/acpgate-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file ruleGroups
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		t.Fatalf("acpgate-rules.yaml: %v", err)
	}
	if len(file.Groups) == 0 {
		t.Fatal("acpgate-rules.yaml has no groups")
	}
	if !reflect.DeepEqual(file, pr.Spec) {
		t.Error("deploy/k8s/prometheusrule.yaml differs from deploy/prometheus/acpgate-rules.yaml: regenerate it (see its header)")
	}
}

func TestKustomizationListsManifests(t *testing.T) {
	m := load(t)
	if m.kustomization == nil {
		t.Fatal("no kustomization.yaml")
	}
	listed := map[string]bool{}
	for _, r := range m.kustomization.Resources {
		if _, err := os.Stat(filepath.Join(k8sDir, r)); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		}
		listed[r] = true
	}
	for f, kinds := range m.files {
		if f == "kustomization.yaml" || strings.Contains(f, "example") {
			if listed[f] {
				t.Errorf("kustomization lists the example %s", f)
			}
			continue
		}
		if !listed[f] {
			t.Errorf("kustomization does not list %s (%v)", f, kinds)
		}
	}
}

// TestCluster checks cluster mode (the gateway's cluster: block): the
// internal listener is a container port that neither the public Service
// nor the Ingress exposes and only the gateway's pods may reach; each
// replica is named after its pod and advertises its pod's address on that
// port; the store is the Redis of redis.yaml, which only the gateway's pods
// may reach; and nothing asks for affinity.
func TestCluster(t *testing.T) {
	m := load(t)
	d, svc := gateway(t, m)
	cfg := gatewayCfg(t, m, d)
	if cfg.Cluster == nil {
		t.Fatal("the gateway's configuration has no cluster: block: replicas behind a Service without affinity need it")
	}
	cl := *cfg.Cluster
	c := d.Spec.Template.Spec.Containers[0]

	// The internal listener.
	cp, ok := containerPort(c, intstr.FromString("cluster"))
	if !ok || cp.ContainerPort != port(t, "cluster.listen", cl.Listen) {
		t.Errorf("container port cluster (%d) is not the port of cluster.listen %q", cp.ContainerPort, cl.Listen)
	}
	if cl.Listen == cfg.Listen || port(t, "cluster.listen", cl.Listen) == port(t, "listen", cfg.Listen) {
		t.Errorf("cluster.listen %q is the public listen %q", cl.Listen, cfg.Listen)
	}
	if h, _, _ := net.SplitHostPort(cl.Listen); h == "127.0.0.1" || h == "localhost" {
		t.Errorf("cluster.listen %q is loopback: the other replicas cannot reach it", cl.Listen)
	}
	for _, p := range svc.Spec.Ports {
		if tp, ok := containerPort(c, p.TargetPort); ok && tp.ContainerPort == cp.ContainerPort {
			t.Errorf("the public Service %s exposes the cluster port (its port %s)", svc.Name, p.Name)
		}
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		t.Errorf("Service %s sets sessionAffinity ClientIP: cluster mode needs none", svc.Name)
	}
	ing := one(t, "Ingress", m.ingresses)
	for k := range ing.Annotations {
		if strings.Contains(k, "affinity") || strings.Contains(k, "session-cookie") || strings.Contains(k, "upstream-hash-by") {
			t.Errorf("Ingress annotation %s: cluster mode needs no affinity", k)
		}
	}
	if cfg.Sessions.AffinityCookie != "" {
		t.Errorf("sessions.affinity_cookie %q: cluster mode has no affinity cookie", cfg.Sessions.AffinityCookie)
	}

	// The replica's name and address: its pod's, from the downward API.
	env := map[string]corev1.EnvVar{}
	var order []string
	for _, e := range c.Env {
		env[e.Name] = e
		order = append(order, e.Name)
	}
	if cl.Name == "" {
		if e, ok := env["ACPGATE_CLUSTER_NAME"]; !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
			t.Error("cluster.name is unset and ACPGATE_CLUSTER_NAME is not the pod's name (fieldRef metadata.name)")
		}
	}
	if cl.Advertise == "" {
		e, ok := env["ACPGATE_CLUSTER_ADVERTISE"]
		want := fmt.Sprintf("http://$(POD_IP):%d", cp.ContainerPort)
		if !ok || e.Value != want {
			t.Errorf("cluster.advertise is unset and ACPGATE_CLUSTER_ADVERTISE is %q; want %q (the default, http://<listen>, is 0.0.0.0)", e.Value, want)
		}
		ip, ok := env["POD_IP"]
		if !ok || ip.ValueFrom == nil || ip.ValueFrom.FieldRef == nil || ip.ValueFrom.FieldRef.FieldPath != "status.podIP" {
			t.Error("POD_IP is not the pod's address (fieldRef status.podIP)")
		} else if slices.Index(order, "POD_IP") > slices.Index(order, "ACPGATE_CLUSTER_ADVERTISE") {
			t.Error("POD_IP comes after ACPGATE_CLUSTER_ADVERTISE: Kubernetes expands $(POD_IP) only from variables above it")
		}
	}
	if cl.KeyFile == "" && cfg.SessionKeyFile == "" && len(cfg.SessionKeyFiles) == 0 {
		t.Error("cluster: without key_file needs a shared session key, from which the replicas' key is derived")
	}
	if cl.Lease != "" {
		if l := duration(t, "cluster.lease", cl.Lease, "5s"); l <= 0 {
			t.Errorf("cluster.lease %s", cl.Lease)
		}
	}

	// The store: a Service of deploy/k8s in front of the Redis Deployment.
	host, sport, err := net.SplitHostPort(strings.SplitN(strings.TrimPrefix(cl.Store, "redis://"), "/", 2)[0])
	if !strings.HasPrefix(cl.Store, "redis://") || err != nil {
		t.Fatalf("cluster.store %q: want redis://HOST:PORT/DB (%v)", cl.Store, err)
	}
	store, ok := m.services[strings.SplitN(host, ".", 2)[0]]
	if !ok {
		t.Fatalf("cluster.store %q: no Service %q in deploy/k8s", cl.Store, host)
	}
	var redis *appsv1.Deployment
	for _, rd := range m.deployments {
		if rd.Name != gatewayName && selects(t, &metav1.LabelSelector{MatchLabels: store.Spec.Selector}, rd.Spec.Template.Labels) {
			redis = rd
		}
	}
	if redis == nil {
		t.Fatalf("Service %s (cluster.store) selects no Deployment of deploy/k8s", store.Name)
	}
	if selects(t, &metav1.LabelSelector{MatchLabels: store.Spec.Selector}, d.Spec.Template.Labels) {
		t.Errorf("Service %s (cluster.store) selects the gateway's pods", store.Name)
	}
	checkPod(t, m, redis)
	found := false
	for _, p := range store.Spec.Ports {
		if fmt.Sprint(p.Port) == sport {
			found = true
			if _, ok := containerPort(redis.Spec.Template.Spec.Containers[0], p.TargetPort); !ok {
				t.Errorf("Service %s port %d: targetPort %s is not a port of Deployment %s", store.Name, p.Port, p.TargetPort.String(), redis.Name)
			}
		}
	}
	if !found {
		t.Errorf("cluster.store %q: Service %s has no port %s", cl.Store, store.Name, sport)
	}
	if redis.Spec.Replicas == nil || *redis.Spec.Replicas != 1 || redis.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("Deployment %s: want 1 replica and strategy Recreate (never two stores at once)", redis.Name)
	}
	// The gateway's PDB, HPA and ServiceMonitor leave the store alone.
	if pdb := one(t, "PodDisruptionBudget", m.pdbs); selects(t, pdb.Spec.Selector, redis.Spec.Template.Labels) {
		t.Errorf("the gateway's PodDisruptionBudget selects the store's pods")
	}
	if sm := one(t, "ServiceMonitor", m.serviceMonitors); selects(t, &sm.Spec.Selector, store.Labels) {
		t.Errorf("the ServiceMonitor selects the store's Service, which has no metrics port")
	}

	// NetworkPolicies: the cluster port from the gateway's pods only, the
	// store from the gateway's pods only.
	gwPods := d.Spec.Template.Labels
	var gwPolicy, storePolicy bool
	for _, np := range m.netPolicies {
		switch {
		case selects(t, &np.Spec.PodSelector, gwPods):
			gwPolicy = true
			checkOnlyFrom(t, np, d, c, "cluster", gwPods)
		case selects(t, &np.Spec.PodSelector, redis.Spec.Template.Labels):
			storePolicy = true
			rc := redis.Spec.Template.Spec.Containers[0]
			for _, p := range rc.Ports {
				checkOnlyFrom(t, np, redis, rc, p.Name, gwPods)
			}
		}
	}
	if !gwPolicy || !storePolicy {
		t.Errorf("want a NetworkPolicy for the gateway's pods (%v) and one for the store's (%v)", gwPolicy, storePolicy)
	}
}

// checkOnlyFrom checks that NetworkPolicy np admits traffic to container
// port portName of d's pods only from pods labelled from.
func checkOnlyFrom(t *testing.T, np *networkingv1.NetworkPolicy, d *appsv1.Deployment, c corev1.Container, portName string, from map[string]string) {
	t.Helper()
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s: no Ingress policy type", np.Name)
	}
	cp, ok := containerPort(c, intstr.FromString(portName))
	if !ok {
		t.Fatalf("Deployment %s has no port %s", d.Name, portName)
	}
	admitted := false
	for i, r := range np.Spec.Ingress {
		covers := len(r.Ports) == 0
		for _, p := range r.Ports {
			if p.Port == nil {
				covers = true
			} else if tp, ok := containerPort(c, *p.Port); ok && tp.ContainerPort == cp.ContainerPort {
				covers = true
			}
		}
		if !covers {
			continue
		}
		if len(r.From) == 0 {
			t.Errorf("NetworkPolicy %s rule %d admits anyone to port %s", np.Name, i, portName)
			continue
		}
		for _, f := range r.From {
			if f.PodSelector == nil || f.NamespaceSelector != nil || f.IPBlock != nil || !selects(t, f.PodSelector, from) {
				t.Errorf("NetworkPolicy %s rule %d admits %+v to port %s; want the gateway's pods only", np.Name, i, f, portName)
			}
		}
		admitted = true
	}
	if !admitted {
		t.Errorf("NetworkPolicy %s admits nobody to port %s", np.Name, portName)
	}
}
