package gcf

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// A misconfigured instance fails its initialisation naming the variable
// and answers every request with a JSON 500, never with half a setup.
func TestMisconfiguredFunction(t *testing.T) {
	t.Setenv("LABKEEP_ENV", "")
	os.Unsetenv("LABKEEP_ENV")
	if err := Init(); err == nil || !strings.Contains(err.Error(), "LABKEEP_ENV") {
		t.Fatalf("Init = %v, want an error naming LABKEEP_ENV", err)
	}
	rec := httptest.NewRecorder()
	serve(rec, httptest.NewRequest(http.MethodGet, "/getSession", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Errorf("serve = %d %s", rec.Code, rec.Body)
	}
}
