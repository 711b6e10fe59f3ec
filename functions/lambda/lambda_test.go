package lambda

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// seen is what the handler received, so the test sees the mapping.
type seen struct {
	Request, Auth, ContentType, Cookie, RemoteAddr, Body string
}

// recorder is a handler that records every request it serves and answers
// status (418 if unset) with two values of one header and a JSON body.
type recorder struct {
	got    []seen
	status int
}

func (h *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.got = append(h.got, seen{
		Request: r.Method + " " + r.URL.RequestURI(), Auth: r.Header.Get("Authorization"),
		ContentType: r.Header.Get("Content-Type"), Cookie: r.Header.Get("Cookie"), RemoteAddr: r.RemoteAddr, Body: string(body),
	})
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	status := h.status
	if status == 0 {
		status = http.StatusTeapot
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"answered":%d}`, status)
}

// sample is an event JSON sample from testdata/.
func sample(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// HTTP API (payload 2.0) and function URL requests reach the handler as
// the request they describe; EventBridge scheduled events as a POST of the
// event to the scheduler path with the scheduler token.
func TestInvokeServesRecognisedEvents(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    seen
	}{
		{"HTTP API payload 2.0 request (base64 body, query, cookies)", sample(t, "http-api-v2.json"), seen{
			Request: "POST /getSession?id=42", Auth: "Bearer tok", ContentType: "application/json",
			Cookie: "a=1; b=2", RemoteAddr: "198.51.100.7", Body: `{"x":1}`,
		}},
		{"function URL request", sample(t, "function-url.json"), seen{
			Request: "POST /openSession", Auth: "Bearer tok", ContentType: "application/json",
			RemoteAddr: "198.51.100.7", Body: `{"lab":"linux-vm"}`,
		}},
		{"EventBridge scheduled rule", sample(t, "eventbridge-scheduled-rule.json"), seen{
			Request: "POST /reapTick", Auth: "Bearer sched", ContentType: "application/json",
			Body: sample(t, "eventbridge-scheduled-rule.json"),
		}},
		{"EventBridge Scheduler default notification", sample(t, "eventbridge-scheduler.json"), seen{
			Request: "POST /reapTick", Auth: "Bearer sched", ContentType: "application/json",
			Body: sample(t, "eventbridge-scheduler.json"),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{status: http.StatusOK}
			a := Adapter{Handler: h, ScheduledPath: "/reapTick", SchedulerToken: "sched"}
			res, err := a.Invoke(context.Background(), json.RawMessage(tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK || res.Headers["X-Multi"] != "a, b" {
				t.Errorf("response = %d %v, want 200 with X-Multi \"a, b\"", res.StatusCode, res.Headers)
			}
			if diff := cmp.Diff([]seen{tc.want}, h.got); diff != "" {
				t.Errorf("handler saw (-want +got):\n%s", diff)
			}
		})
	}
}

// Every other event fails the invocation with ErrUnrecognisedEvent and
// never reaches the handler: in particular none is taken for a scheduled
// run, which would carry the scheduler token.
func TestInvokeRefusesOtherEvents(t *testing.T) {
	tests := []struct {
		name    string
		payload string
	}{
		{"API Gateway REST API request", sample(t, "apigw-rest-v1.json")},
		{"HTTP API payload 1.0 request", sample(t, "http-api-v1.json")},
		{"ALB request", sample(t, "alb.json")},
		{"S3 event", sample(t, "s3.json")},
		{"EventBridge event that is not a schedule", sample(t, "eventbridge-ec2-state.json")},
		{"scheduled event from a source that is not AWS's scheduler", `{"version":"0","id":"1","detail-type":"Scheduled Event","source":"my.app","account":"123456789012","time":"2026-12-01T10:00:00Z","region":"eu-west-1","resources":[],"detail":{}}`},
		{"scheduled event without the envelope version", `{"source":"aws.events","detail-type":"Scheduled Event"}`},
		{"scheduled event with version 2.0", `{"version":"2.0","source":"aws.events","detail-type":"Scheduled Event"}`},
		{"requestContext.http.method without version 2.0", `{"rawPath":"/reapTick","requestContext":{"http":{"method":"POST"}}}`},
		{"empty object", `{}`},
		{"null", `null`},
		{"array", `[]`},
		{"string", `"reapTick"`},
		{"garbage", `not json at all`},
		{"truncated JSON", `{"version":"2.0","requestContext":`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{}
			a := Adapter{Handler: h, ScheduledPath: "/reapTick", SchedulerToken: "sched"}
			res, err := a.Invoke(context.Background(), json.RawMessage(tc.payload))
			if !errors.Is(err, ErrUnrecognisedEvent) {
				t.Errorf("Invoke = %d, %v; want an error wrapping %v", res.StatusCode, err, ErrUnrecognisedEvent)
			}
			if len(h.got) != 0 {
				t.Errorf("the handler was called with %+v", h.got)
			}
		})
	}
}

// Without a scheduler path a scheduled event is refused, not served.
func TestInvokeRefusesSchedulesWithoutAScheduledPath(t *testing.T) {
	h := &recorder{}
	_, err := Adapter{Handler: h}.Invoke(context.Background(), json.RawMessage(sample(t, "eventbridge-scheduled-rule.json")))
	if err == nil || len(h.got) != 0 {
		t.Errorf("Invoke = %v, handler saw %+v; want an error and no call", err, h.got)
	}
}

// A scheduled run that answers non-2xx fails the invocation, so Lambda's
// Errors metric and retries see it; an HTTP request's answer, 5xx included,
// is returned for API Gateway to relay and never fails the invocation.
func TestInvokeFailsOnlyFailedScheduledRuns(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		status  int
		wantErr bool
	}{
		{"scheduled run that ran (or was skipped): 200", "eventbridge-scheduled-rule.json", 200, false},
		{"scheduled run that failed: 500", "eventbridge-scheduled-rule.json", 500, true},
		{"scheduled run refused (wrong scheduler token): 401", "eventbridge-scheduler.json", 401, true},
		{"scheduled run busy for an unexpected reason: 409", "eventbridge-scheduled-rule.json", 409, true},
		{"HTTP API request answered 500", "http-api-v2.json", 500, false},
		{"function URL request answered 503", "function-url.json", 503, false},
		{"HTTP API request answered 401", "http-api-v2.json", 401, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &recorder{status: tc.status}
			a := Adapter{Handler: h, ScheduledPath: "/reapTick", SchedulerToken: "sched"}
			res, err := a.Invoke(context.Background(), json.RawMessage(sample(t, tc.payload)))
			if got := errors.Is(err, ErrScheduledRunFailed); got != tc.wantErr || (err != nil && !got) {
				t.Fatalf("Invoke error = %v, want ErrScheduledRunFailed: %v", err, tc.wantErr)
			}
			if tc.wantErr && !strings.Contains(err.Error(), fmt.Sprintf(`answered %d: {"answered":%d}`, tc.status, tc.status)) {
				t.Errorf("error %q does not quote the status and answer", err)
			}
			if res.StatusCode != tc.status || len(h.got) != 1 {
				t.Errorf("response %d after %d calls, want %d after 1", res.StatusCode, len(h.got), tc.status)
			}
		})
	}
}
