// Package lambda adapts the session functions' http.Handler to AWS Lambda:
// API Gateway HTTP API (payload v2) and Lambda function URL requests become
// ordinary *http.Request values, and EventBridge schedule events become a
// POST to the scheduler path (reapTick). It holds no domain logic, so Lambda
// behaves exactly like the Knative server.
package lambda

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// Adapter turns Lambda invocations into requests to Handler.
type Adapter struct {
	Handler http.Handler
	// ScheduledPath receives events that are not HTTP requests (EventBridge
	// schedules), as a POST with the event as body; "" rejects them.
	ScheduledPath string
	// SchedulerToken is sent as "Authorization: Bearer …" with scheduled
	// events, as a scheduler calling over HTTP would.
	SchedulerToken string
}

// Invoke is the Lambda entry point (pass it to lambda.Start).
func (a Adapter) Invoke(ctx context.Context, payload json.RawMessage) (events.APIGatewayV2HTTPResponse, error) {
	var probe struct {
		RequestContext struct {
			HTTP struct {
				Method string `json:"method"`
			} `json:"http"`
		} `json:"requestContext"`
	}
	_ = json.Unmarshal(payload, &probe)
	var req *http.Request
	var err error
	if probe.RequestContext.HTTP.Method != "" {
		var ev events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return events.APIGatewayV2HTTPResponse{}, fmt.Errorf("decoding HTTP event: %w", err)
		}
		req, err = httpRequest(ctx, ev)
	} else {
		if a.ScheduledPath == "" {
			return events.APIGatewayV2HTTPResponse{}, fmt.Errorf("not an HTTP event and no scheduled path configured")
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, a.ScheduledPath, bytes.NewReader(payload))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+a.SchedulerToken)
		}
	}
	if err != nil {
		return events.APIGatewayV2HTTPResponse{}, err
	}
	rec := httptest.NewRecorder()
	a.Handler.ServeHTTP(rec, req)
	res := events.APIGatewayV2HTTPResponse{StatusCode: rec.Code, Headers: map[string]string{}, Body: rec.Body.String()}
	for k, v := range rec.Header() {
		res.Headers[k] = strings.Join(v, ", ")
	}
	return res, nil
}

func httpRequest(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		var err error
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return nil, fmt.Errorf("decoding base64 body: %w", err)
		}
	}
	u := url.URL{Path: ev.RawPath, RawQuery: ev.RawQueryString}
	if u.Path == "" {
		u.Path = ev.RequestContext.HTTP.Path
	}
	req, err := http.NewRequestWithContext(ctx, ev.RequestContext.HTTP.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range ev.Headers {
		req.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	req.RemoteAddr = ev.RequestContext.HTTP.SourceIP
	req.ContentLength = int64(len(body))
	return req, nil
}
