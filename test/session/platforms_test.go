package session_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"labkeep/functions/lambda"
	"labkeep/localrun/stacktest"
)

// The Lambda build runs the very same handler: an API Gateway HTTP API
// event opens a real session and a second one gets the same 409 as over
// plain HTTP.
func TestLambdaAdapterOnTheRealStack(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	a := lambda.Adapter{Handler: e.App.Handler(), ScheduledPath: "/reapTick"}
	event := func(method, path, body string) json.RawMessage {
		ev := events.APIGatewayV2HTTPRequest{
			Version: "2.0", RawPath: path, Body: body,
			Headers: map[string]string{"authorization": "Bearer " + e.Token("lam", "student"), "content-type": "application/json"},
		}
		ev.RequestContext.HTTP.Method = method
		b, _ := json.Marshal(ev)
		return b
	}
	res, err := a.Invoke(context.Background(), event("POST", "/openSession", `{"lab":"linux-vm"}`))
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("open via Lambda = %d %s %v", res.StatusCode, res.Body, err)
	}
	var s stacktest.SessionView
	json.Unmarshal([]byte(res.Body), &s)
	if got := e.Objects("labkeep.io/session=" + s.ID); len(got) < 3 {
		t.Errorf("objects of the Lambda-opened session = %v", got)
	}
	res, _ = a.Invoke(context.Background(), event("POST", "/openSession", `{"lab":"shell"}`))
	if res.StatusCode != 409 || res.Headers["Content-Type"] != "application/json" {
		t.Errorf("second open via Lambda = %d %v %s", res.StatusCode, res.Headers, res.Body)
	}
}
