package portal

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(h http.Handler, method, path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
	return w
}

// Every portal response carries the security headers; the page and its
// files are served under Prefix, /portal redirects there, anything else
// goes to the API behind.
func TestMountServesThePageWithItsHeaders(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	p := New()
	p.Handle("extra", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }))
	h := p.Mount(api)
	tests := []struct {
		name, method, path string
		wantStatus         int
		wantType           string
		wantHeaders        bool
	}{
		{"the page", "GET", "/portal/", http.StatusOK, "text/html; charset=utf-8", true},
		{"its script", "GET", "/portal/portal.js", http.StatusOK, "text/javascript; charset=utf-8", true},
		{"its styles", "GET", "/portal/portal.css", http.StatusOK, "text/css; charset=utf-8", true},
		{"HEAD", "HEAD", "/portal/portal.js", http.StatusOK, "text/javascript; charset=utf-8", true},
		{"a path under the portal it does not serve", "GET", "/portal/nope.js", http.StatusTeapot, "", false},
		{"POST is refused", "POST", "/portal/", http.StatusMethodNotAllowed, "", true},
		{"a handler added under the portal", "GET", "/portal/extra", http.StatusAccepted, "", true},
		{"/portal redirects", "GET", "/portal", http.StatusMovedPermanently, "", false},
		{"the API", "GET", "/getSession", http.StatusTeapot, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(h, tc.method, tc.path)
			if w.Code != tc.wantStatus {
				t.Fatalf("%s %s = %d, want %d", tc.method, tc.path, w.Code, tc.wantStatus)
			}
			if tc.wantType != "" && w.Header().Get("Content-Type") != tc.wantType {
				t.Errorf("Content-Type = %q, want %q", w.Header().Get("Content-Type"), tc.wantType)
			}
			want := map[string]string{
				"Content-Security-Policy": ContentSecurityPolicy,
				"X-Content-Type-Options":  "nosniff",
				"X-Frame-Options":         "DENY",
				"Referrer-Policy":         "no-referrer",
			}
			for k, v := range want {
				got := w.Header().Get(k)
				if tc.wantHeaders && got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
				if !tc.wantHeaders && got != "" {
					t.Errorf("%s set outside the portal: %q", k, got)
				}
			}
		})
	}
	if loc := serve(h, "GET", "/portal").Header().Get("Location"); loc != Prefix {
		t.Errorf("/portal redirects to %q, want %q", loc, Prefix)
	}
}

var scriptTag = regexp.MustCompile(`(?i)<script[^>]*>`)

// The policy allows nothing inline, so no page may carry inline script,
// inline style or event-handler attributes: the browser would refuse them.
func TestPagesHaveNothingInline(t *testing.T) {
	inline := []*regexp.Regexp{
		regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>\s*[^<\s]`), // a script element with content
		regexp.MustCompile(`(?i)<style`),
		regexp.MustCompile(`(?i)\sstyle=`),
		regexp.MustCompile(`(?i)\son[a-z]+=`),
		regexp.MustCompile(`(?i)javascript:`),
	}
	var pages int
	err := fs.WalkDir(Static(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(path, ".html") {
			return err
		}
		pages++
		data, err := fs.ReadFile(Static(), path)
		if err != nil {
			return err
		}
		for _, tag := range scriptTag.FindAll(data, -1) {
			if !strings.Contains(string(tag), " src=") {
				t.Errorf("%s has a script element without src: %q", path, tag)
			}
		}
		for _, re := range inline {
			if m := re.Find(data); m != nil {
				t.Errorf("%s has inline content the policy refuses: %q", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if pages == 0 {
		t.Fatal("no pages embedded")
	}
}

// The policy itself keeps everything to this origin and nothing inline.
func TestPolicyIsStrict(t *testing.T) {
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, want) {
			t.Errorf("policy lacks %q: %s", want, ContentSecurityPolicy)
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "*", "data: 'self'; script"} {
		if strings.Contains(ContentSecurityPolicy, bad) {
			t.Errorf("policy allows %q: %s", bad, ContentSecurityPolicy)
		}
	}
}
