package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"labkeep/functions/gcf"
	"labkeep/functions/lambda"
	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/httpapi"
	"labkeep/shared/reap"
)

// The deploy templates of infra/aws (AWS SAM) and infra/gcp (Terraform)
// carry what the functions need: the entry point the code registers, a
// reapTick every minute in the shape the platform shim turns into POST
// /reapTick, every setting app.Config requires and none it does not read,
// credentials from the secret stores only, one environment name
// throughout, and (SAM) every HTTP route of shared/httpapi. Neither sam,
// cfn-lint nor terraform runs here (no network to AWS or Google, no
// provider schemas): this checks the templates as text, not that the
// clouds accept them.

// deployEnv is the environment the templates are rendered for.
const deployEnv = "dev"

// scheduledPath is where the platform shims send a scheduled tick.
const scheduledPath = "/reapTick"

func TestDeployTemplates(t *testing.T) {
	sam := readRepoFile(t, "infra/aws/template.yaml")
	tf := readRepoFile(t, "infra/gcp/main.tf")
	in := deployInputs(t)
	t.Run("SAM template", func(t *testing.T) {
		for _, p := range samProblems(sam, in) {
			t.Error(p)
		}
	})
	t.Run("Terraform", func(t *testing.T) {
		for _, p := range tfProblems(tf, in) {
			t.Error(p)
		}
	})
	// The aud and iss come from parameters a deployer must give: no
	// default, nothing empty accepted.
	t.Run("aud and iss have no default", func(t *testing.T) {
		for _, p := range []string{"JwtAudience", "JwtIssuer"} {
			block := regexp.MustCompile(`(?m)^  ` + p + `:\n((?:    .*\n)+)`).FindSubmatch(sam)
			if block == nil || bytes.Contains(block[1], []byte("Default:")) || !bytes.Contains(block[1], []byte("MinLength: 1")) {
				t.Errorf("template.yaml's %s parameter: %q, want MinLength: 1 and no Default", p, block)
			}
		}
		for _, v := range []string{"jwt_audience", "jwt_issuer"} {
			block := regexp.MustCompile(`(?s)variable "` + v + `" \{(.*?)\n\}`).FindSubmatch(tf)
			if block == nil || bytes.Contains(block[1], []byte("default")) || !bytes.Contains(block[1], []byte("length(var."+v+") > 0")) {
				t.Errorf("main.tf's %s variable: %q, want a validation of its length and no default", v, block)
			}
		}
	})
	// The SAM schedule leaves its input unset, so Scheduler sends its
	// default event (as recorded in functions/lambda's testdata); the
	// Lambda command hands that to reapTick with the scheduler token.
	t.Run("Scheduler's default event reaches reapTick", func(t *testing.T) {
		if !bytes.Contains(readRepoFile(t, "functions/cmd/labkeep-lambda/main.go"), []byte(`ScheduledPath: "`+scheduledPath+`"`)) {
			t.Errorf("functions/cmd/labkeep-lambda does not send scheduled events to %s", scheduledPath)
		}
		var got *http.Request
		a := lambda.Adapter{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r }), ScheduledPath: scheduledPath, SchedulerToken: "scheduler-token"}
		if _, err := a.Invoke(context.Background(), readRepoFile(t, "functions/lambda/testdata/eventbridge-scheduler.json")); err != nil {
			t.Fatal(err)
		}
		if got == nil || got.Method != http.MethodPost || got.URL.Path != scheduledPath || got.Header.Get("Authorization") != "Bearer scheduler-token" {
			t.Errorf("Scheduler's default event became %v, want POST %s with the scheduler token", got, scheduledPath)
		}
	})
	// Each mutation is a mistake the checks must catch: a copy of a
	// template with it must be reported with the given problem.
	mutations := []struct {
		name     string
		tf       bool // main.tf, else template.yaml
		old, new string
		want     string
	}{
		{"a route left out", false, "Method: GET, Path: /labs,", "Method: GET, Path: /labz,", "GET /labs is not routed"},
		{"payload format 1.0, which the adapter refuses", false, `Path: /getSession, PayloadFormatVersion: "2.0"`, `Path: /getSession, PayloadFormatVersion: "1.0"`, "PayloadFormatVersion"},
		{"reapTick every five minutes", false, "rate(1 minute)", "rate(5 minutes)", "every minute"},
		{"a schedule with its own input", false, "State: ENABLED", "State: ENABLED\n            Input: '{\"tick\": true}'", "Input"},
		{"another handler", false, "Handler: bootstrap", "Handler: main", "Handler"},
		{"the audience left out", false, "          LABKEEP_JWT_AUDIENCE: {Ref: JwtAudience}\n", "", "LABKEEP_JWT_AUDIENCE is required of every deploy template"},
		{"the issuer left out", true, "      LABKEEP_JWT_ISSUER          = var.jwt_issuer\n", "", "LABKEEP_JWT_ISSUER is required of every deploy template"},
		{"the scheduler token left out", false, "          LABKEEP_SCHEDULER_TOKEN:\n", "          LABKEEP_SCHEDULER_TOKN:\n", "LABKEEP_SCHEDULER_TOKEN is required"},
		{"the metrics token left out", false, "          LABKEEP_METRICS_TOKEN:\n", "          LABKEEP_METRICS_TOKN:\n", "LABKEEP_METRICS_TOKEN is not set"},
		{"the metrics token left out of the secrets", true, "    LABKEEP_METRICS_TOKEN   = \"labkeep-metrics-token-${var.env}\"\n", "", "LABKEEP_METRICS_TOKEN is not set"},
		{"the metrics token as a literal", false, `Fn::Sub: "{{resolve:secretsmanager:${MetricsTokenSecret}}}"`, "a-literal-metrics-token-0123456789", "LABKEEP_METRICS_TOKEN must come from the secret store"},
		{"an IAM authorizer on /metrics", false, "Method: GET, Path: /metrics, PayloadFormatVersion: \"2.0\"}", "Method: GET, Path: /metrics, PayloadFormatVersion: \"2.0\", Auth: {Authorizer: AWS_IAM}}", "authorizer"},
		{"a local-stack setting Config does not read", false, "          LABKEEP_LABS_FILE:", "          LABKEEP_REAP_INTERVAL: 1m\n          LABKEEP_LABS_FILE:", "LABKEEP_REAP_INTERVAL"},
		{"a secret as a literal", false, `Fn::Sub: "{{resolve:secretsmanager:${JwtSecretSecret}}}"`, "a-literal-secret-of-at-least-32-bytes", "LABKEEP_JWT_SECRET"},
		{"another environment's namespace", false, "Fn::Sub: labkeep-sessions-${EnvName}", "Fn::Sub: labkeep-sessions-prod", "LABKEEP_NAMESPACE"},
		{"no Errors alarm", false, "MetricName: Errors", "MetricName: Throttles", "Errors"},
		{"EKS access policy", false, "      Type: STANDARD\n", "      Type: STANDARD\n      AccessPolicies: [{PolicyArn: \"arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy\", AccessScope: {Type: cluster}}]\n", "AccessPolicies"},
		{"entry point spelt otherwise", true, `entry_point = "Labkeep"`, `entry_point = "labkeep"`, "entry_point"},
		{"runtime behind go.mod", true, `default     = "go126"`, `default     = "go121"`, "runtime"},
		{"reapTick every five minutes", true, `schedule         = "* * * * *"`, `schedule         = "*/5 * * * *"`, "every minute"},
		{"OIDC token overwriting the Authorization header", true, "  http_target {\n    http_method", "  http_target {\n    oidc_token {\n      service_account_email = google_service_account.scheduler.email\n    }\n    http_method", "oidc_token"},
		{"another path", true, `/reapTick"`, `/reaptick"`, "/reapTick"},
		{"a secret as a literal", true, "      LABKEEP_ENV                 = var.env\n", "      LABKEEP_ENV                 = var.env\n      LABKEEP_JWT_SECRET          = \"a-literal-secret-of-at-least-32-bytes\"\n", "LABKEEP_JWT_SECRET"},
		{"a setting Config does not read", true, "      LABKEEP_ENV                 = var.env\n", "      LABKEEP_ENV                 = var.env\n      LABKEEP_STATE_DIR           = \"/tmp\"\n", "LABKEEP_STATE_DIR"},
		{"a hard-coded environment", true, "      LABKEEP_ENV                 = var.env\n", "      LABKEEP_ENV                 = \"prod\"\n", "LABKEEP_ENV"},
		{"a broader IAM grant", true, `permissions = ["container.clusters.get"]`, `permissions = ["container.clusters.get", "container.pods.create"]`, "container.clusters.get"},
		{"a predefined GKE role", true, "  role    = google_project_iam_custom_role.cluster_connect.id", `  role    = "roles/container.developer"`, "roles/container.developer"},
	}
	for _, m := range mutations {
		file := "template.yaml"
		if m.tf {
			file = "main.tf"
		}
		t.Run("mutated "+file+": "+m.name, func(t *testing.T) {
			src := sam
			if m.tf {
				src = tf
			}
			if !bytes.Contains(src, []byte(m.old)) {
				t.Fatalf("%s no longer contains %q: update the mutation", file, m.old)
			}
			mutated := bytes.Replace(src, []byte(m.old), []byte(m.new), 1)
			var problems []string
			if m.tf {
				problems = tfProblems(mutated, in)
			} else {
				problems = samProblems(mutated, in)
			}
			for _, p := range problems {
				if strings.Contains(p, m.want) {
					t.Logf("caught: %s", p)
					return
				}
			}
			t.Errorf("no problem mentions %q; found %q", m.want, problems)
		})
	}
}

// inputs are what the templates are checked against, all taken from the
// code.
type inputs struct {
	settings  []setting         // app.Config
	routes    map[string]string // path → method, shared/httpapi
	goRuntime string            // Cloud Functions runtime of go.mod's go line
	makeArch  string            // infra/aws/Makefile's GOARCH
	awsUser   string            // the user infra/aws/rbac.yaml binds, for deployEnv
	stageDir  string            // where infra/gcp/stage.sh writes, under infra/gcp
}

func deployInputs(t *testing.T) inputs {
	t.Helper()
	in := inputs{settings: appSettings(t), routes: httpapi.Routes()}
	if len(in.routes) < 10 || in.routes[scheduledPath] != http.MethodPost {
		t.Fatalf("httpapi.Routes() = %v: want the API's routes, POST %s among them", in.routes, scheduledPath)
	}
	m := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindSubmatch(readRepoFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	in.goRuntime = "go" + string(m[1]) + string(m[2])
	a := regexp.MustCompile(`(?m)^GOARCH \?= (\S+)$`).FindSubmatch(readRepoFile(t, "infra/aws/Makefile"))
	if a == nil {
		t.Fatal("infra/aws/Makefile sets no GOARCH")
	}
	in.makeArch = string(a[1])
	in.awsUser = rbacUser(t, "aws", renderRBAC(t, "aws", deployEnv))
	o := regexp.MustCompile(`(?m)^out=\$\{1:-\$here/(\S+)\}$`).FindSubmatch(readRepoFile(t, "infra/gcp/stage.sh"))
	if o == nil {
		t.Fatal("infra/gcp/stage.sh has no default output directory")
	}
	in.stageDir = string(o[1])
	return in
}

// renderRBAC is infra/<cloud>/rbac.yaml rendered for environment env,
// as infra/README.md has envsubst do it.
func renderRBAC(t *testing.T, cloud, env string) []*unstructured.Unstructured {
	t.Helper()
	vars := map[string]string{"ENV": env, "GSA": "labkeep-functions-" + env + "@labkeep-test.iam.gserviceaccount.com"}
	text := os.Expand(string(readRepoFile(t, "infra/"+cloud+"/rbac.yaml")), func(k string) string {
		v, ok := vars[k]
		if !ok {
			t.Errorf("infra/%s/rbac.yaml uses $%s, which infra/README.md does not set", cloud, k)
		}
		return v
	})
	objs, err := decodeYAML([]byte(text))
	if err != nil {
		t.Fatalf("infra/%s/rbac.yaml: %v", cloud, err)
	}
	return objs
}

// rbacUser is the one subject, a user, of objs' one RoleBinding.
func rbacUser(t *testing.T, cloud string, objs []*unstructured.Unstructured) string {
	t.Helper()
	var users []string
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" {
			continue
		}
		var rb rbacv1.RoleBinding
		typed(t, o, &rb)
		for _, s := range rb.Subjects {
			if s.Kind != rbacv1.UserKind {
				t.Fatalf("infra/%s/rbac.yaml binds %s %s, want only the cloud identity's user", cloud, s.Kind, s.Name)
			}
			users = append(users, s.Name)
		}
	}
	if len(users) != 1 {
		t.Fatalf("infra/%s/rbac.yaml binds users %v, want exactly the cloud identity", cloud, users)
	}
	return users[0]
}

func readRepoFile(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// envProblems checks one template's environment: values maps each
// LABKEEP_* variable it sets to its value rendered for deployEnv (""
// where it is no plain string), secret those taken from a secret store.
func envProblems(where string, values map[string]string, secret map[string]bool, in inputs) []string {
	var out []string
	known := map[string]bool{}
	for _, s := range in.settings {
		known[s.Key] = true
		if _, ok := values[s.Key]; s.Required && !ok {
			out = append(out, fmt.Sprintf("%s: %s is required by app.Config.Validate and not set", where, s.Key))
		}
	}
	for _, k := range deployRequired {
		if _, ok := values[k]; !ok {
			out = append(out, fmt.Sprintf("%s: %s is required of every deploy template and not set", where, k))
		}
	}
	for k := range values {
		if strings.HasPrefix(k, "LABKEEP_") && !known[k] {
			out = append(out, fmt.Sprintf("%s: sets %s, which app.Config does not read", where, k))
		}
	}
	// Neither cloud gives /metrics a listener of its own, so it is on the
	// public handler and answers only the metrics token.
	if _, own := values["LABKEEP_METRICS_ADDR"]; !own {
		if _, ok := values["LABKEEP_METRICS_TOKEN"]; !ok {
			out = append(out, fmt.Sprintf("%s: /metrics is on the public handler and LABKEEP_METRICS_TOKEN is not set: every scrape would be refused", where))
		}
	}
	for _, k := range append(slices.Clone(secretSettings), optionalSecrets...) {
		if _, ok := values[k]; ok && !secret[k] {
			out = append(out, fmt.Sprintf("%s: %s must come from the secret store, not a literal value", where, k))
		}
	}
	want := map[string]string{
		"LABKEEP_ENV":                deployEnv,
		"LABKEEP_NAMESPACE":          "labkeep-sessions-" + deployEnv,
		"LABKEEP_PLATFORM_NAMESPACE": "labkeep-" + deployEnv,
	}
	for k, v := range want {
		if values[k] != v {
			out = append(out, fmt.Sprintf("%s: %s is %q for environment %s, want %q (infra/overlays/env's names)", where, k, values[k], deployEnv, v))
		}
	}
	return out
}

// samProblems checks infra/aws/template.yaml.
func samProblems(src []byte, in inputs) []string {
	var tmpl struct {
		Parameters map[string]any
		Resources  map[string]struct {
			Type       string
			Properties json.RawMessage
		}
	}
	if err := yaml.Unmarshal(src, &tmpl); err != nil {
		return []string{fmt.Sprintf("template.yaml: %v", err)}
	}
	if _, ok := tmpl.Parameters["EnvName"]; !ok {
		return []string{"template.yaml: no EnvName parameter"}
	}
	var out []string
	bad := func(format string, args ...any) { out = append(out, "template.yaml: "+fmt.Sprintf(format, args...)) }
	var fnName string
	var fn struct {
		Handler, Runtime, CodeUri string
		Architectures             []string
		Timeout                   int
		Role                      any
		Environment               struct{ Variables map[string]any }
		Events                    map[string]struct {
			Type       string
			Properties map[string]any
		}
	}
	for name, r := range tmpl.Resources {
		if r.Type != "AWS::Serverless::Function" {
			continue
		}
		if fnName != "" {
			bad("two functions, %s and %s: the one codebase is one function", fnName, name)
		}
		fnName = name
		if err := json.Unmarshal(r.Properties, &fn); err != nil {
			bad("function %s: %v", name, err)
		}
	}
	if fnName == "" {
		return append(out, "template.yaml: no AWS::Serverless::Function")
	}
	if fn.Handler != "bootstrap" || fn.Runtime != "provided.al2023" {
		bad("Handler %q, Runtime %q: want bootstrap on provided.al2023 (functions/cmd/labkeep-lambda built as bootstrap)", fn.Handler, fn.Runtime)
	}
	if !slices.Equal(fn.Architectures, []string{in.makeArch}) {
		bad("Architectures %v, but infra/aws/Makefile builds for GOARCH %s", fn.Architectures, in.makeArch)
	}
	if fn.CodeUri != "build/function/" {
		bad("CodeUri %q: want build/function/, what make -C infra/aws writes", fn.CodeUri)
	}
	if deadline := reap.DefaultConfig().RunDeadline; time.Duration(fn.Timeout)*time.Second <= deadline {
		bad("Timeout %ds: want above the reaper's run deadline %s, so a run ends by its own deadline", fn.Timeout, deadline)
	}

	// Routes: every route but reapTick, in payload format 2.0 (the only
	// one functions/lambda accepts); reapTick only from the schedule.
	routed := map[string]string{}
	schedules := 0
	for name, ev := range fn.Events {
		switch ev.Type {
		case "HttpApi":
			method, _ := ev.Properties["Method"].(string)
			path, _ := ev.Properties["Path"].(string)
			routed[path] = method
			if v := ev.Properties["PayloadFormatVersion"]; v != "2.0" {
				bad("event %s (%s %s): PayloadFormatVersion %v, want \"2.0\": functions/lambda refuses any other", name, method, path, v)
			}
			if path == "/metrics" {
				if _, ok := ev.Properties["Auth"]; ok {
					bad("GET /metrics has an authorizer: it would take the Authorization header the metrics token travels in")
				}
			}
		case "ScheduleV2":
			schedules++
			if ev.Properties["ScheduleExpression"] != "rate(1 minute)" {
				bad("schedule %s: %v, want reapTick every minute: rate(1 minute)", name, ev.Properties["ScheduleExpression"])
			}
			if _, ok := ev.Properties["Input"]; ok {
				bad("schedule %s sets Input: functions/lambda takes only Scheduler's default Scheduled Event for reapTick", name)
			}
		default:
			bad("event %s: type %s, which functions/lambda does not take", name, ev.Type)
		}
	}
	if schedules != 1 {
		bad("%d ScheduleV2 events, want exactly one reapTick every minute", schedules)
	}
	for path, method := range in.routes {
		switch got, ok := routed[path]; {
		case path == scheduledPath && ok:
			bad("%s is routed on the HTTP API; the schedule invokes it directly", path)
		case path != scheduledPath && !ok:
			bad("%s %s is not routed on the HTTP API", method, path)
		case ok && got != method:
			bad("%s is routed for %s, the API serves it for %s", path, got, method)
		}
	}
	for path := range routed {
		if _, ok := in.routes[path]; !ok {
			bad("%s is routed, but shared/httpapi serves no such route", path)
		}
	}

	// Environment.
	values, secret := map[string]string{}, map[string]bool{}
	for k, v := range fn.Environment.Variables {
		values[k] = renderCFN(v)
		if m, ok := v.(map[string]any); ok {
			if sub, ok := m["Fn::Sub"].(string); ok && strings.HasPrefix(sub, "{{resolve:secretsmanager:") {
				secret[k] = true
			}
		}
	}
	out = append(out, envProblems("template.yaml", values, secret, in)...)
	if !strings.HasPrefix(values["LABKEEP_KUBECONFIG"], "/var/task/") || !strings.HasPrefix(values["LABKEEP_LABS_FILE"], "/var/task/") {
		bad("LABKEEP_KUBECONFIG %q and LABKEEP_LABS_FILE %q: want the files make packs in /var/task", values["LABKEEP_KUBECONFIG"], values["LABKEEP_LABS_FILE"])
	}

	// Identity: the function's role is the access entry's principal, the
	// access entry's user is the one infra/aws/rbac.yaml binds, and no
	// EKS access policy (cluster-wide) is attached.
	entries, errorsAlarm := 0, false
	for name, r := range tmpl.Resources {
		switch r.Type {
		case "AWS::EKS::AccessEntry":
			entries++
			var e struct {
				PrincipalArn, Username any
				Type                   string
				AccessPolicies         []any
				KubernetesGroups       []string
			}
			if err := json.Unmarshal(r.Properties, &e); err != nil {
				bad("%s: %v", name, err)
				continue
			}
			if renderCFN(e.PrincipalArn) != renderCFN(fn.Role) || renderCFN(e.PrincipalArn) == "" {
				bad("access entry %s maps %v, the function runs as %v", name, e.PrincipalArn, fn.Role)
			}
			if renderCFN(e.Username) != in.awsUser {
				bad("access entry %s: username %v, but infra/aws/rbac.yaml binds %q", name, e.Username, in.awsUser)
			}
			if len(e.AccessPolicies) > 0 || len(e.KubernetesGroups) > 0 {
				bad("access entry %s grants AccessPolicies %v / groups %v: its only right is infra/aws/rbac.yaml's impersonation", name, e.AccessPolicies, e.KubernetesGroups)
			}
		case "AWS::CloudWatch::Alarm":
			var a struct {
				Namespace, MetricName string
				Dimensions            []struct {
					Name  string
					Value any
				}
			}
			if err := json.Unmarshal(r.Properties, &a); err == nil && a.Namespace == "AWS/Lambda" && a.MetricName == "Errors" &&
				len(a.Dimensions) == 1 && a.Dimensions[0].Name == "FunctionName" && renderCFN(a.Dimensions[0].Value) == "Ref "+fnName {
				errorsAlarm = true
			}
		}
	}
	if entries != 1 {
		bad("%d EKS access entries, want one for the function's role", entries)
	}
	if !errorsAlarm {
		bad("no alarm on AWS/Lambda Errors of %s: failed reaper runs fail the invocation and nothing else shows them", fnName)
	}
	return out
}

// renderCFN is a CloudFormation value as text for deployEnv: a string as
// it is, Fn::Sub with ${EnvName} replaced, Ref EnvName as the env; any
// other Ref or Fn::GetAtt as "Ref X" or "GetAtt X.Y".
func renderCFN(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case map[string]any:
		if s, ok := v["Fn::Sub"].(string); ok {
			return strings.ReplaceAll(s, "${EnvName}", deployEnv)
		}
		if r, ok := v["Ref"].(string); ok {
			if r == "EnvName" {
				return deployEnv
			}
			return "Ref " + r
		}
		if g, ok := v["Fn::GetAtt"].([]any); ok {
			return fmt.Sprintf("GetAtt %v.%v", g...)
		}
	}
	return ""
}

// tfModule is main.tf parsed, with an evaluation context holding every
// variable's default, env set to deployEnv.
type tfModule struct {
	body *hclsyntax.Body
	ctx  *hcl.EvalContext
}

func parseTF(src []byte) (*tfModule, error) {
	f, diags := hclparse.NewParser().ParseHCL(src, "main.tf")
	if diags.HasErrors() {
		return nil, diags
	}
	body := f.Body.(*hclsyntax.Body)
	vars := map[string]cty.Value{"env": cty.StringVal(deployEnv), "project": cty.StringVal("labkeep-test"), "gke_cluster": cty.StringVal("sessions")}
	for _, b := range body.Blocks {
		if b.Type != "variable" || len(b.Labels) != 1 {
			continue
		}
		if _, set := vars[b.Labels[0]]; set {
			continue
		}
		if d, ok := b.Body.Attributes["default"]; ok {
			v, diags := d.Expr.Value(nil)
			if diags.HasErrors() {
				return nil, diags
			}
			vars[b.Labels[0]] = v
		}
	}
	tostring := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
		Type:   function.StaticReturnType(cty.String),
		Impl:   func(args []cty.Value, _ cty.Type) (cty.Value, error) { return convert.Convert(args[0], cty.String) },
	})
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{
		"var":  cty.ObjectVal(vars),
		"path": cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal("infra/gcp")}),
	}, Functions: map[string]function.Function{"tostring": tostring}}
	m := &tfModule{body: body, ctx: ctx}
	if locals := m.blocks(body, "locals"); len(locals) == 1 {
		l := map[string]cty.Value{}
		for name, a := range locals[0].Body.Attributes {
			if v, diags := a.Expr.Value(ctx); !diags.HasErrors() {
				l[name] = v
			}
		}
		ctx.Variables["local"] = cty.ObjectVal(l)
	}
	return m, nil
}

func (m *tfModule) blocks(body *hclsyntax.Body, typ string, labels ...string) []*hclsyntax.Block {
	var out []*hclsyntax.Block
	for _, b := range body.Blocks {
		if b.Type == typ && (len(labels) == 0 || slices.Equal(b.Labels[:min(len(labels), len(b.Labels))], labels)) {
			out = append(out, b)
		}
	}
	return out
}

// str evaluates attribute name of body as a string ("" if it is not one
// this context can evaluate).
func (m *tfModule) str(body *hclsyntax.Body, name string) string {
	a, ok := body.Attributes[name]
	if !ok {
		return ""
	}
	v, diags := a.Expr.Value(m.ctx)
	if diags.HasErrors() || v.IsNull() || !v.IsKnown() {
		return ""
	}
	if v, err := convert.Convert(v, cty.String); err == nil {
		return v.AsString()
	}
	return ""
}

// refs lists what attribute name of body refers to, as "a.b.c".
func refs(body *hclsyntax.Body, name string) []string {
	a, ok := body.Attributes[name]
	if !ok {
		return nil
	}
	var out []string
	for _, tr := range a.Expr.Variables() {
		parts := []string{tr.RootName()}
		for _, s := range tr[1:] {
			if at, ok := s.(hcl.TraverseAttr); ok {
				parts = append(parts, at.Name)
			}
		}
		out = append(out, strings.Join(parts, "."))
	}
	return out
}

// tfProblems checks infra/gcp/main.tf.
func tfProblems(src []byte, in inputs) []string {
	m, err := parseTF(src)
	if err != nil {
		return []string{fmt.Sprintf("main.tf: %v", err)}
	}
	var out []string
	bad := func(format string, args ...any) { out = append(out, "main.tf: "+fmt.Sprintf(format, args...)) }
	fns := m.blocks(m.body, "resource", "google_cloudfunctions2_function")
	if len(fns) != 1 {
		return []string{fmt.Sprintf("main.tf: %d google_cloudfunctions2_function resources, want 1", len(fns))}
	}
	fn := fns[0]
	fnRef := "google_cloudfunctions2_function." + fn.Labels[1]
	build := m.blocks(fn.Body, "build_config")
	service := m.blocks(fn.Body, "service_config")
	if len(build) != 1 || len(service) != 1 {
		return append(out, "main.tf: the function needs one build_config and one service_config")
	}
	if got := m.str(build[0].Body, "entry_point"); got != gcf.FunctionName {
		bad("entry_point %q: functions/gcf registers %q", got, gcf.FunctionName)
	}
	if got := m.str(build[0].Body, "runtime"); got != in.goRuntime {
		bad("runtime %q: go.mod's go line wants %s", got, in.goRuntime)
	}
	if src := m.blocks(build[0].Body, "source"); len(src) != 1 || len(m.blocks(src[0].Body, "storage_source")) != 1 {
		bad("the function's source is not a storage_source (stage.sh's layout, zipped)")
	}
	if archives := m.blocks(m.body, "data", "archive_file"); len(archives) != 1 || m.str(archives[0].Body, "source_dir") != "infra/gcp/"+in.stageDir {
		bad("the source archive is not what infra/gcp/stage.sh writes, infra/gcp/%s", in.stageDir)
	}
	sa := refs(service[0].Body, "service_account_email")
	if len(sa) != 1 || !strings.HasPrefix(sa[0], "google_service_account.") {
		bad("the function runs as %v, not a service account of its own", sa)
	}

	// Environment: literal variables and secrets.
	values, secret := map[string]string{}, map[string]bool{}
	if a, ok := service[0].Body.Attributes["environment_variables"]; ok {
		obj, ok := a.Expr.(*hclsyntax.ObjectConsExpr)
		if !ok {
			bad("environment_variables is not an object")
		} else {
			for _, item := range obj.Items {
				k, diags := item.KeyExpr.Value(m.ctx)
				if diags.HasErrors() || k.Type() != cty.String {
					bad("environment_variables has a key that is not a name")
					continue
				}
				v, diags := item.ValueExpr.Value(m.ctx)
				values[k.AsString()] = ""
				if !diags.HasErrors() && v.Type() == cty.String {
					values[k.AsString()] = v.AsString()
				}
			}
		}
	}
	for _, d := range m.blocks(service[0].Body, "dynamic", "secret_environment_variables") {
		each, ok := d.Body.Attributes["for_each"]
		if !ok {
			continue
		}
		v, diags := each.Expr.Value(m.ctx)
		if diags.HasErrors() || !v.CanIterateElements() {
			bad("secret_environment_variables' for_each cannot be read")
			continue
		}
		for it := v.ElementIterator(); it.Next(); {
			k, _ := it.Element()
			if _, literal := values[k.AsString()]; literal {
				values[k.AsString()] = ""
				continue // set twice: the literal wins the report
			}
			values[k.AsString()], secret[k.AsString()] = "", true
		}
	}
	for _, s := range m.blocks(service[0].Body, "secret_environment_variables") {
		k := m.str(s.Body, "key")
		values[k], secret[k] = "", true
	}
	out = append(out, envProblems("main.tf", values, secret, in)...)

	// reapTick every minute with the scheduler token; no OIDC token,
	// which would overwrite the Authorization header reapTick reads.
	jobs := m.blocks(m.body, "resource", "google_cloud_scheduler_job")
	if len(jobs) != 1 {
		return append(out, fmt.Sprintf("main.tf: %d google_cloud_scheduler_job resources, want 1 (reapTick)", len(jobs)))
	}
	job := jobs[0].Body
	if got := m.str(job, "schedule"); got != "* * * * *" {
		bad("the scheduler job runs %q, want reapTick every minute: * * * * *", got)
	}
	target := m.blocks(job, "http_target")
	if len(target) != 1 {
		return append(out, "main.tf: the scheduler job has no http_target")
	}
	if m.str(target[0].Body, "http_method") != http.MethodPost {
		bad("the scheduler job's method is %q, reapTick takes POST", m.str(target[0].Body, "http_method"))
	}
	uri := target[0].Body.Attributes["uri"]
	if tmpl, ok := uri.Expr.(*hclsyntax.TemplateExpr); !ok || len(tmpl.Parts) != 2 ||
		!slices.Contains(refs(target[0].Body, "uri"), fnRef+".url") {
		bad("the scheduler job's uri is not the function's url followed by %s", scheduledPath)
	} else if lit, ok := tmpl.Parts[1].(*hclsyntax.LiteralValueExpr); !ok || lit.Val.AsString() != scheduledPath {
		bad("the scheduler job calls another path than %s", scheduledPath)
	}
	if len(m.blocks(target[0].Body, "oidc_token")) > 0 || len(m.blocks(target[0].Body, "oauth_token")) > 0 {
		bad("the scheduler job sends an oidc_token/oauth_token: it replaces the Authorization header, and reapTick refuses anything but the scheduler token there")
	}
	if !slices.Contains(refs(target[0].Body, "headers"), "data.google_secret_manager_secret_version.scheduler_token.secret_data") {
		bad("the scheduler job does not send the scheduler token (Authorization: Bearer <LABKEEP_SCHEDULER_TOKEN>)")
	} else if v := m.blocks(m.body, "data", "google_secret_manager_secret_version", "scheduler_token"); len(v) != 1 ||
		!slices.Contains(refs(v[0].Body, "secret"), "local.secrets.LABKEEP_SCHEDULER_TOKEN") {
		bad("the scheduler job's token is not the secret the function reads as LABKEEP_SCHEDULER_TOKEN")
	}

	// IAM: only the custom role's container.clusters.get towards GKE.
	for _, r := range m.blocks(m.body, "resource", "google_project_iam_custom_role") {
		v, diags := r.Body.Attributes["permissions"].Expr.Value(m.ctx)
		if diags.HasErrors() || !v.CanIterateElements() || v.LengthInt() != 1 || v.Index(cty.NumberIntVal(0)).AsString() != "container.clusters.get" {
			bad("custom role %s grants more than container.clusters.get, GKE's gate before RBAC", r.Labels[1])
		}
	}
	for _, r := range m.blocks(m.body, "resource") {
		if role := m.str(r.Body, "role"); strings.HasPrefix(role, "roles/container.") {
			bad("%s %s grants %s: Kubernetes rights come from infra/gcp/rbac.yaml only", r.Labels[0], r.Labels[1], role)
		}
	}
	return out
}

// The Cloud Functions source as Google's Go buildpack builds it: the
// function package at the root of a module whose path has a dot, importing
// the framework's functions package (the buildpack's declarative main);
// that main, generated here as the buildpack does, builds against the
// working tree, serves the entry point functions/gcf registers (answering
// 500 while its settings are missing), and is the credential plugin the
// kubeconfig runs: client-go, given infra/gcp's kubeconfig, sends the
// metadata server's token and impersonates the functions' ServiceAccount.
func TestGCFSourceLayout(t *testing.T) {
	fnDir := filepath.Join(repoRoot, "infra/gcp/function")
	src := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "function.go"} {
		if err := os.WriteFile(filepath.Join(src, f), readRepoFile(t, "infra/gcp/function/"+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	goCmd(src, "mod", "edit", "-replace", "labkeep="+repoRoot)
	module := goCmd(src, "list", "-m")
	if first, _, _ := strings.Cut(module, "/"); !strings.Contains(first, ".") {
		t.Errorf("module path %q: the buildpack wants a dot in its first element", module)
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(fnDir, "function.go"), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var imports []string
	for _, imp := range f.Imports {
		imports = append(imports, strings.Trim(imp.Path.Value, `"`))
	}
	if f.Name.Name == "main" || !slices.Contains(imports, "github.com/GoogleCloudPlatform/functions-framework-go/functions") ||
		!slices.Contains(imports, "labkeep/functions/gcf") {
		t.Errorf("root package %s imports %v: want a non-main package importing the framework's functions package (declarative) and labkeep/functions/gcf", f.Name.Name, imports)
	}
	// The buildpack's declarative main (GoogleCloudPlatform/buildpacks,
	// cmd/go/functions_framework), in the directory it uses.
	mainDir := filepath.Join(src, "functions.local", "app")
	if err := os.MkdirAll(mainDir, 0o755); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf(`package main

import (
	"log"
	"net/http"
	"os"

	_ %q

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
)

func main() {
	http.HandleFunc("/robots.txt", http.NotFound)
	http.HandleFunc("/favicon.ico", http.NotFound)
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.Start(port); err != nil {
		log.Fatalf("Function failed to start: %%v\n", err)
	}
}
`, module)
	if err := os.WriteFile(filepath.Join(mainDir, "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "function")
	goCmd(src, "build", "-o", bin, "./functions.local/app")

	t.Run("serves the entry point", func(t *testing.T) {
		port := strconv.Itoa(freePort(t))
		cmd := exec.Command(bin)
		cmd.Env = []string{"PORT=" + port, "FUNCTION_TARGET=" + gcf.FunctionName, "PATH=" + os.Getenv("PATH")}
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		var res *http.Response
		stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
			var err error
			res, err = http.Get("http://127.0.0.1:" + port + "/healthz")
			return err == nil, fmt.Sprint(err)
		})
		defer res.Body.Close()
		var body struct{ Error struct{ Code string } }
		_ = json.NewDecoder(res.Body).Decode(&body)
		if res.StatusCode != http.StatusInternalServerError || body.Error.Code != "internal" {
			t.Errorf("GET /healthz without settings = %d %+v, want 500 internal (the function's own answer)", res.StatusCode, body)
		}
	})

	t.Run("is the kubeconfig's credential plugin", func(t *testing.T) {
		metadata := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/computeMetadata/v1/instance/service-accounts/default/token" || r.Header.Get("Metadata-Flavor") != "Google" {
				http.Error(w, "not the token request", http.StatusNotFound)
				return
			}
			fmt.Fprint(w, `{"access_token":"ya29.from-metadata","expires_in":3599,"token_type":"Bearer"}`)
		}))
		defer metadata.Close()
		var seen http.Header
		apiserver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r.Header.Clone()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"major":"1","minor":"33","gitVersion":"v1.33.13"}`)
		}))
		defer apiserver.Close()
		kubeconfig := renderTFKubeconfig(t, strings.TrimPrefix(apiserver.URL, "http://"))
		rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		// The test is not the function: run the function's binary where
		// the function runs itself (/proc/self/exe), over plain HTTP.
		if rc.ExecProvider == nil || rc.ExecProvider.Command != "/proc/self/exe" {
			t.Fatalf("kubeconfig's exec plugin = %+v, want the function itself (/proc/self/exe)", rc.ExecProvider)
		}
		rc.ExecProvider.Command = bin
		rc.ExecProvider.Env = append(rc.ExecProvider.Env, clientcmdapi.ExecEnvVar{Name: "GCE_METADATA_HOST", Value: strings.TrimPrefix(metadata.URL, "http://")})
		rc.Host, rc.TLSClientConfig = apiserver.URL, rest.TLSClientConfig{}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Discovery().ServerVersion(); err != nil {
			t.Fatal(err)
		}
		want := http.Header{
			"Authorization":    {"Bearer ya29.from-metadata"},
			"Impersonate-User": {"system:serviceaccount:labkeep-" + deployEnv + ":" + infra.ServiceAccount},
		}
		for k, v := range want {
			if !slices.Equal(seen.Values(k), v) {
				t.Errorf("client-go sent %s %q, want %q", k, seen.Values(k), v)
			}
		}
	})
}

// renderTFKubeconfig is infra/gcp/kubeconfig.tftpl as main.tf renders it
// for deployEnv, with endpoint as the cluster's.
func renderTFKubeconfig(t *testing.T, endpoint string) []byte {
	t.Helper()
	r := strings.NewReplacer("${endpoint}", endpoint, "${ca_data}", "", "${env}", deployEnv)
	return []byte(r.Replace(string(readRepoFile(t, "infra/gcp/kubeconfig.tftpl"))))
}

// renderAWSKubeconfig is infra/aws/kubeconfig.tmpl as make renders it.
func renderAWSKubeconfig(t *testing.T) []byte {
	t.Helper()
	r := strings.NewReplacer("@SERVER@", "https://eks.example", "@CA_DATA@", "", "@CLUSTER@", "sessions", "@ENV@", deployEnv)
	return []byte(r.Replace(string(readRepoFile(t, "infra/aws/kubeconfig.tmpl"))))
}

// The clouds' identities, given infra/{aws,gcp}/rbac.yaml, may
// impersonate the functions' ServiceAccount of their environment and
// nothing else, and acting through the kubeconfig's `as` they are that
// ServiceAccount: infra/base/rbac.yaml's Role lets them work in the sessions
// namespace and the labkeep-functions admission policy refuses what
// labkeep would never create. The local API server cannot authenticate
// AWS or Google tokens, so a ServiceAccount of its own stands in for the
// cloud identity (the binding's subject is switched to it).
func TestCloudIdentityImpersonatesOnlyTheFunctions(t *testing.T) {
	ctx := context.Background()
	suffix := stacktest.Suffix()
	env := "dt" + suffix
	place := infra.Placement{Functions: "labkeep-" + env, Sessions: "dt-vms-" + suffix}
	cloudNS := "dt-cloud-" + suffix
	admin, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	createPlacement(t, admin, place, cloudNS)
	installAdmissionPolicy(t, place, env)
	awaitDefaultServiceAccount(t, admin, place.Sessions)

	kubeconfigs := map[string][]byte{"aws": renderAWSKubeconfig(t), "gcp": renderTFKubeconfig(t, "gke.example")}
	for _, cloud := range []string{"aws", "gcp"} {
		t.Run(cloud, func(t *testing.T) {
			// The kubeconfig's `as`, with this test's environment.
			rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfigs[cloud])
			if err != nil {
				t.Fatal(err)
			}
			wantAs := "system:serviceaccount:labkeep-" + deployEnv + ":" + infra.ServiceAccount
			if rc.Impersonate.UserName != wantAs {
				t.Fatalf("infra/%s's kubeconfig acts as %q, want %q", cloud, rc.Impersonate.UserName, wantAs)
			}
			as := "system:serviceaccount:" + place.Functions + ":" + infra.ServiceAccount

			// infra/<cloud>/rbac.yaml for this environment, bound to the
			// stand-in.
			standIn := cloud + "-identity"
			if _, err := admin.CoreV1().ServiceAccounts(cloudNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: standIn}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			objs := renderRBAC(t, cloud, env)
			rbacUser(t, cloud, objs)
			for _, o := range objs {
				if o.GetKind() == "RoleBinding" {
					o.Object["subjects"] = []any{map[string]any{"kind": "ServiceAccount", "name": standIn, "namespace": cloudNS}}
				}
				if err := api.apply(ctx, o, "", false); err != nil {
					t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			tok, err := admin.CoreV1().ServiceAccounts(cloudNS).CreateToken(ctx, standIn, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			identity := &rest.Config{Host: api.admin.Host, TLSClientConfig: rest.TLSClientConfig{CAData: api.admin.CAData, CAFile: api.admin.CAFile}, BearerToken: tok.Status.Token}
			acting := func(user string) *kubernetes.Clientset {
				rc := rest.CopyConfig(identity)
				rc.Impersonate = rest.ImpersonationConfig{UserName: user}
				return kubernetes.NewForConfigOrDie(rc)
			}
			listPods := func(c *kubernetes.Clientset) error {
				_, err := c.CoreV1().Pods(place.Sessions).List(ctx, metav1.ListOptions{})
				return err
			}
			if err := listPods(kubernetes.NewForConfigOrDie(identity)); err == nil {
				t.Errorf("the cloud identity itself lists Pods in %s; its only right should be the impersonation", place.Sessions)
			}
			if err := listPods(acting(as)); err != nil {
				t.Errorf("as %s the cloud identity cannot list Pods in %s: %v", as, place.Sessions, err)
			}
			for _, other := range []string{"system:serviceaccount:" + place.Functions + ":default", "system:serviceaccount:kube-system:default", "admin"} {
				if err := listPods(acting(other)); err == nil {
					t.Errorf("the cloud identity may act as %s", other)
				}
			}
			// A Pod no labkeep code builds (no labels, privileged): RBAC
			// lets the ServiceAccount create Pods, the admission policy
			// must refuse it. The policy is active a moment after it is
			// created.
			dyn := dynamic.NewForConfigOrDie(func() *rest.Config {
				rc := rest.CopyConfig(identity)
				rc.Impersonate = rest.ImpersonationConfig{UserName: as}
				return rc
			}())
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "crafted"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "x", Image: "registry.k8s.io/pause:3.10",
					SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)},
				}}},
			}
			awaitPolicy(t, dyn, podsGVR, place.Sessions, pod, "labkeep admission")
		})
	}
}
