package session

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"labkeep/shared/labs"
)

// homesFunc is a Homes answering with its function, counting the asks.
type homesFunc struct {
	asked *int
	fn    func(student string, lab labs.Lab) error
}

func (h homesFunc) HomeFor(_ context.Context, student string, lab labs.Lab) (string, error) {
	*h.asked++
	if err := h.fn(student, lab); err != nil {
		return "", err
	}
	return "home-of-" + student, nil
}

// An open of a lab that keeps a home asks Homes first; a refusal (the
// student's homes would pass their total) or a deployment without Homes
// ends the open before its row is written, with nothing created. Labs
// without a home never ask.
func TestOpenAsksForTheHomeFirst(t *testing.T) {
	cat, err := labs.Parse([]byte(`labs:
- {name: plain, kind: pod, image: img, nodes: [{role: workspace}]}
- {name: kept, kind: pod, image: img, nodes: [{role: workspace}], home: {size: 1Gi, mountPath: /root}}
`))
	if err != nil {
		t.Fatal(err)
	}
	full := fmt.Errorf("%w: over the total", ErrHomeQuota)
	tests := []struct {
		name      string
		lab       string
		homes     func(string, labs.Lab) error // nil: no Homes
		wantErr   error                        // nil: opened
		wantAsked int
	}{
		{"a home that fits opens", "kept", func(string, labs.Lab) error { return nil }, nil, 1},
		{"a home past the total is refused", "kept", func(string, labs.Lab) error { return full }, ErrHomeQuota, 1},
		{"a lab without a home is not asked about", "plain", func(string, labs.Lab) error { return full }, nil, 0},
		{"a home with no Homes is refused", "kept", nil, errors.New("keeps a home, and this deployment keeps none"), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			c := &fakeCluster{}
			svc, store := newService(t, c, &now)
			svc.Labs = cat
			asked := 0
			if tc.homes != nil {
				svc.Homes = homesFunc{asked: &asked, fn: func(student string, lab labs.Lab) error {
					if student != "ann" || lab.Name != tc.lab {
						t.Errorf("asked about %s's %s; want ann's %s", student, lab.Name, tc.lab)
					}
					return tc.homes(student, lab)
				}}
			}
			_, err := svc.Open(context.Background(), "ann", tc.lab, "")
			if asked != tc.wantAsked {
				t.Errorf("Homes asked %d times, want %d", asked, tc.wantAsked)
			}
			if tc.wantErr == nil {
				if err != nil || len(c.provisioned) != 1 {
					t.Errorf("Open = %v, provisioned %v; want one session", err, c.provisioned)
				}
				wantHome := map[bool]string{true: "home-of-ann"}[tc.wantAsked > 0]
				for _, row := range store.rows {
					if row.Home != wantHome {
						t.Errorf("the row's home = %q, want %q", row.Home, wantHome)
					}
				}
				return
			}
			if err == nil || !(errors.Is(err, tc.wantErr) || err.Error() == "lab kept "+tc.wantErr.Error()) {
				t.Errorf("Open = %v, want %v", err, tc.wantErr)
			}
			if len(store.rows) != 0 || len(c.provisioned) != 0 {
				t.Errorf("a refused open left rows %v and provisioned %v", store.rows, c.provisioned)
			}
		})
	}
}
