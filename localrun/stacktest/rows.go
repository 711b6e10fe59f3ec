package stacktest

import (
	"context"

	"labkeep/shared/session"
)

// Count runs a query returning one number on the deployment's database.
func (d *Deployment) Count(sql string, args ...any) int {
	d.t.Helper()
	var n int
	if err := d.DB.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		d.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Rows is every session row as "id student status expires_at", sorted,
// for before/after comparisons.
func (d *Deployment) Rows() []string {
	d.t.Helper()
	return d.Strings(`SELECT id::text || ' ' || student || ' ' || status || ' ' || expires_at::text FROM sessions ORDER BY 1`)
}

// LiveIDs are the ids of the live (provisioning or running) sessions.
func (d *Deployment) LiveIDs() map[string]bool {
	d.t.Helper()
	ids := map[string]bool{}
	for _, id := range d.Strings(`SELECT id::text FROM sessions WHERE status IN ('provisioning','running')`) {
		ids[id] = true
	}
	return ids
}

// Strings runs a query returning one text column on the deployment's
// database and returns its values in the query's order, nil for no rows.
func (d *Deployment) Strings(sql string, args ...any) []string {
	d.t.Helper()
	rows, err := d.DB.Query(context.Background(), sql, args...)
	if err != nil {
		d.t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	return out
}

// Session reads session id's row through the functions' store.
func (d *Deployment) Session(id string) session.Session {
	d.t.Helper()
	s, err := d.App.Store.Get(context.Background(), id)
	if err != nil {
		d.t.Fatalf("session %s: %v", id, err)
	}
	return s
}

// ForgetRow deletes session id's row and leaves its objects: what a
// backend that crashed between creating objects and committing its row
// leaves behind.
func (d *Deployment) ForgetRow(id string) {
	d.t.Helper()
	if _, err := d.DB.Exec(context.Background(), "DELETE FROM sessions WHERE id = $1", id); err != nil {
		d.t.Fatal(err)
	}
}

// RowStatus reads session id's stored status with the test's own pool,
// which works after the functions (and their store) have stopped.
func (d *Deployment) RowStatus(id string) session.Status {
	d.t.Helper()
	var s string
	if err := d.DB.QueryRow(context.Background(), "SELECT status FROM sessions WHERE id = $1", id).Scan(&s); err != nil {
		d.t.Fatal(err)
	}
	return session.Status(s)
}
