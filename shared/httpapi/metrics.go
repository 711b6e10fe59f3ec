package httpapi

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTPMetrics times every request the functions answer, by route and
// status code (labkeep_http_request_duration_seconds).
//
// The route is the path's first segment (/openSession, /terminal,
// /portal), so a route's sub-paths share one series. A path first
// answered 404 has no route yet and is counted as "other": only a segment
// some request got a non-404 answer for becomes a route, so callers
// sending made-up paths cannot grow the series without bound, while a
// real route's 404s (no_session) keep their route once it is known.
type HTTPMetrics struct {
	latency *prometheus.HistogramVec
	routes  sync.Map // first segment → struct{}
}

// OtherRoute labels requests for paths no route has answered yet.
const OtherRoute = "other"

// NewHTTPMetrics creates the series and registers them with reg.
func NewHTTPMetrics(reg prometheus.Registerer) *HTTPMetrics {
	m := &HTTPMetrics{latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "labkeep_http_request_duration_seconds", Help: "Time to answer a request, by route (the path's first segment) and status code.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "code"})}
	reg.MustRegister(m.latency)
	return m
}

// Instrument returns h timed by m, on the wall clock (a latency, not a
// time of the session's lifetime, which the injected clock is for). It keeps what h's writer can do beyond
// writing (hijack for the terminal's WebSocket, flush).
func (m *HTTPMetrics) Instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			m.latency.WithLabelValues(m.route(r.URL.Path, code), strconv.Itoa(code)).Observe(time.Since(start).Seconds())
		}()
		h.ServeHTTP(sw, r)
	})
}

func (m *HTTPMetrics) route(path string, code int) string {
	seg, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	route := "/" + seg
	if code != http.StatusNotFound {
		m.routes.Store(route, struct{}{})
		return route
	}
	if _, known := m.routes.Load(route); known {
		return route
	}
	return OtherRoute
}

// statusWriter records the status code h sent (a hijacked connection's is
// 101 Switching Protocols).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
