package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
)

// Only Open reads the catalog: once the lab a session was opened from is
// gone from the catalog in force (a reload), the session still refreshes,
// extends and closes (torn down), and its row keeps the nodes it was
// opened with, which teardown works from.
func TestSessionsOutliveTheirLab(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{ready: true}
	svc, store := newService(t, c, &now)
	ctx := context.Background()
	opened, err := svc.Open(ctx, "ann", "three", "")
	if err != nil {
		t.Fatal(err)
	}
	s := opened.Session
	without, err := labs.Parse([]byte("labs:\n- {name: one, kind: vm, nodes: [{role: vm}], disk: {containerDisk: img}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc.Labs = without
	if _, err := svc.Open(ctx, "bob", "three", ""); !errors.Is(err, ErrUnknownLab) {
		t.Fatalf("open of the removed lab = %v, want ErrUnknownLab", err)
	}
	now = now.Add(30 * time.Minute)
	extended, err := svc.Extend(ctx, "ann", s.ID)
	if err != nil || !extended.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("extend after the lab left the catalog = %v %v", extended.ExpiresAt, err)
	}
	closed, err := svc.Close(ctx, "ann", s.ID, ActorStudent, "ann")
	if err != nil || closed.Status != StatusClosed {
		t.Fatalf("close after the lab left the catalog = %s %v", closed.Status, err)
	}
	if diff := cmp.Diff([]string{s.ID}, c.tornDown); diff != "" {
		t.Errorf("torn down (-want +got):\n%s", diff)
	}
	row, _ := store.Get(ctx, s.ID)
	var names []string
	for _, n := range row.Nodes {
		names = append(names, n.Name)
	}
	if diff := cmp.Diff([]string{"control", "worker-1", "worker-2"}, names); diff != "" {
		t.Errorf("stored nodes (-want +got):\n%s", diff)
	}
}
