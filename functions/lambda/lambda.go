// Package lambda adapts the session functions' http.Handler to AWS Lambda.
// It recognises exactly two kinds of invocation: API Gateway HTTP API
// (payload format 2.0) and Lambda function URL requests, which become
// ordinary *http.Request values, and EventBridge scheduled events (a
// scheduled rule's or EventBridge Scheduler's default notification), which
// become a POST to the scheduler path (reapTick) carrying the scheduler
// token. Anything else — API Gateway REST or HTTP API payload 1.0, ALB,
// S3, SQS, a hand-made test event — fails the invocation with
// ErrUnrecognisedEvent and never reaches the handler: an event of unknown
// shape must not be taken for a scheduler that holds the token. It holds
// no domain logic, so Lambda behaves exactly like the Knative server.
//
// Failures and Lambda's metrics: a scheduled event whose run answers
// anything but 2xx fails the invocation (ErrScheduledRunFailed), so
// Lambda's Errors metric, its retries and an on-failure destination see a
// reaper that did not run; a skipped run (another one going) answers 200
// and is no failure. An HTTP request's answer, 5xx included, is returned
// as the invocation's result, not as an error: API Gateway and function
// URLs relay it to the caller with its status, error body and Retry-After,
// where a failed invocation would become a bare 502; such answers show in
// API Gateway's 5XXError metric and in the functions' logs.
package lambda

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// ErrUnrecognisedEvent is returned, and the invocation fails without
// anything being called, for an event that is neither an HTTP API
// (payload 2.0) or function URL request nor an EventBridge scheduled event.
var ErrUnrecognisedEvent = errors.New("unrecognised Lambda event")

// ErrScheduledRunFailed is returned, failing the invocation, when a
// scheduled event's request answered anything but 2xx.
var ErrScheduledRunFailed = errors.New("scheduled run failed")

// maxErrorBody bounds how much of a failed scheduled run's answer the
// invocation error quotes.
const maxErrorBody = 1024

// Markers of the recognised events, as AWS sends them.
const (
	// httpPayloadVersion is the "version" of HTTP API payload format 2.0,
	// which function URLs use too (REST APIs send none, HTTP API payload
	// 1.0 sends "1.0").
	httpPayloadVersion = "2.0"
	// scheduledVersion and scheduledDetailType mark the EventBridge event
	// envelope of a schedule.
	scheduledVersion    = "0"
	scheduledDetailType = "Scheduled Event"
)

// scheduledSources are the sources of scheduled events: "aws.events" for
// an EventBridge scheduled rule, "aws.scheduler" for an EventBridge
// Scheduler schedule whose target input is left unset. PutEvents refuses
// sources beginning with "aws.", so no application's event can carry them.
var scheduledSources = map[string]bool{"aws.events": true, "aws.scheduler": true}

// Adapter turns Lambda invocations into requests to Handler.
type Adapter struct {
	Handler http.Handler
	// ScheduledPath receives EventBridge scheduled events, as a POST with
	// the event as body; "" refuses them.
	ScheduledPath string
	// SchedulerToken is sent as "Authorization: Bearer …" with scheduled
	// events, as a scheduler calling over HTTP would.
	SchedulerToken string
}

// eventKind is what an invocation's payload is.
type eventKind int

const (
	httpEvent eventKind = iota + 1
	scheduledEvent
)

// envelope holds the fields that tell the recognised events apart.
type envelope struct {
	Version        string `json:"version"`
	RequestContext struct {
		HTTP struct {
			Method string `json:"method"`
		} `json:"http"`
	} `json:"requestContext"`
	Source     string `json:"source"`
	DetailType string `json:"detail-type"`
}

// classify says which recognised event payload is, or returns
// ErrUnrecognisedEvent naming what it found.
func classify(payload []byte) (eventKind, error) {
	var env envelope
	if err := json.Unmarshal(payload, &env); err != nil {
		return 0, fmt.Errorf("%w: payload is not a JSON object: %v", ErrUnrecognisedEvent, err)
	}
	// The two versions differ, so no payload is both.
	switch {
	case env.Version == httpPayloadVersion && env.RequestContext.HTTP.Method != "":
		return httpEvent, nil
	case env.Version == scheduledVersion && env.DetailType == scheduledDetailType && scheduledSources[env.Source]:
		return scheduledEvent, nil
	}
	return 0, fmt.Errorf("%w: want an API Gateway HTTP API (payload %s) or function URL request, or an EventBridge %q event from aws.events or aws.scheduler; got version %q, requestContext.http.method %q, source %q, detail-type %q",
		ErrUnrecognisedEvent, httpPayloadVersion, scheduledDetailType, env.Version, env.RequestContext.HTTP.Method, env.Source, env.DetailType)
}

// Invoke is the Lambda entry point (pass it to lambda.Start). An event it
// does not recognise, or cannot decode, is an error: the invocation fails
// and Handler is not called. A scheduled run answering non-2xx is an error
// too (ErrScheduledRunFailed); an HTTP request's answer never is.
func (a Adapter) Invoke(ctx context.Context, payload json.RawMessage) (events.APIGatewayV2HTTPResponse, error) {
	kind, err := classify(payload)
	if err != nil {
		return events.APIGatewayV2HTTPResponse{}, err
	}
	var req *http.Request
	switch kind {
	case httpEvent:
		var ev events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return events.APIGatewayV2HTTPResponse{}, fmt.Errorf("decoding HTTP event: %w", err)
		}
		req, err = httpRequest(ctx, ev)
	case scheduledEvent:
		req, err = a.scheduledRequest(ctx, payload)
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
	if kind == scheduledEvent && (rec.Code < 200 || rec.Code > 299) {
		body := res.Body
		if len(body) > maxErrorBody {
			body = body[:maxErrorBody] + "…"
		}
		return res, fmt.Errorf("%w: POST %s answered %d: %s", ErrScheduledRunFailed, a.ScheduledPath, rec.Code, body)
	}
	return res, nil
}

// scheduledRequest is the POST to ScheduledPath a scheduled event becomes.
func (a Adapter) scheduledRequest(ctx context.Context, payload []byte) (*http.Request, error) {
	var ev events.EventBridgeEvent
	if err := json.Unmarshal(payload, &ev); err != nil {
		return nil, fmt.Errorf("decoding scheduled event: %w", err)
	}
	if a.ScheduledPath == "" {
		return nil, fmt.Errorf("scheduled event from %s, but no scheduled path is configured", ev.Source)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.ScheduledPath, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.SchedulerToken)
	return req, nil
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
