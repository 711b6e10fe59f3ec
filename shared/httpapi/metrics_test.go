package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// Requests are counted by route and code; a made-up path stays "other"
// while a real route's 404 keeps its route.
func TestHTTPMetricsRoutes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewHTTPMetrics(reg)
	mux := http.NewServeMux()
	mux.HandleFunc("/getSession", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("none") != "" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "{}")
	})
	mux.HandleFunc("/terminal/", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := httptest.NewServer(m.Instrument(mux))
	defer srv.Close()
	for _, path := range []string{
		"/getSession?none=1", // a 404 before the route is known: other
		"/getSession",
		"/getSession?none=1",
		"/terminal/connect",
		"/terminal/cleanup",
		"/made-up", "/also/made-up",
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			var l []string
			for _, p := range s.GetLabel() {
				l = append(l, p.GetName()+"="+p.GetValue())
			}
			got = append(got, fmt.Sprintf("%s %d", strings.Join(l, ","), s.GetHistogram().GetSampleCount()))
		}
	}
	slices.Sort(got)
	want := []string{
		"code=200,route=/getSession 1",
		"code=404,route=/getSession 1",
		"code=404,route=other 3",
		"code=418,route=/terminal 2",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}
