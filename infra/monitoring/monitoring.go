// Package monitoring is labkeep's monitoring kit: the files of this
// directory (kubectl apply -k infra/monitoring/). The Go here hands tests
// the alert rules as Prometheus reads them.
package monitoring

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"
)

//go:embed prometheusrule.yaml
var ruleFile []byte

// RuleGroups is the PrometheusRule's spec as the rule groups document
// Prometheus reads (what the Operator hands it), for Prometheus's own
// rule parser.
func RuleGroups() ([]byte, error) {
	var r struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(ruleFile, &r); err != nil {
		return nil, fmt.Errorf("prometheusrule.yaml: %w", err)
	}
	return yaml.JSONToYAML(r.Spec)
}
