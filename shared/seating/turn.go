package seating

import (
	"context"
	"fmt"
	"sync"

	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Refusals without the capacity lock. Opens of one process take turns
// at the database's capacity lock: one waits for it, the others wait
// here. Every decision under the lock records what it counted (lastCounts);
// each time it does, every open waiting for its turn looks again, and one
// that count can only refuse is refused at once, without the lock. A
// burst of students at a full lab so gets its refusals as fast as the
// decisions before them are made, instead of one lock hold after another.
// The cap stays exact: a refusal admits nothing, and every admission is
// still decided under the lock. Only a count made while the open waited
// refuses it, so it is never older than the open's own wait; an open
// that finds its turn free is decided under the lock as before.

// counted is what a decision under the capacity lock found in one
// bucket, with the decision's own effect included (an admission's need, a
// joined line), and the change it was (lastCounts.seq).
type counted struct {
	used, reserved, waiting int
	seq                     uint64
}

// lastCounts is the last count of each bucket in this process.
type lastCounts struct {
	mu sync.Mutex
	by map[labs.Kind]counted
	// seq numbers the changes (records and forgets); changed is closed
	// (and replaced) at each.
	seq     uint64
	changed chan struct{}
}

func newLastCounts() *lastCounts {
	return &lastCounts{by: map[labs.Kind]counted{}, changed: make(chan struct{})}
}

// last returns kind's last count, if any, the number of the latest
// change, and a channel closed at the next one.
func (l *lastCounts) last(kind labs.Kind) (counted, bool, uint64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.by[kind]
	return c, ok, l.seq, l.changed
}

func (l *lastCounts) record(kind labs.Kind, c counted) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	c.seq = l.seq
	l.by[kind] = c
	close(l.changed)
	l.changed = make(chan struct{})
}

// forget drops every count: capacity was freed (or the line served).
func (l *lastCounts) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	clear(l.by)
	close(l.changed)
	l.changed = make(chan struct{})
}

// takeTurn waits for this process's turn at the capacity lock, or, when
// refuse is not nil, for a count of bucket kind made while it waits that
// refuse refuses, whichever comes first; release ends the turn. ctx
// bounds the wait.
func (u *Usher) takeTurn(ctx context.Context, kind labs.Kind, refuse func(counted) error) (release func(), err error) {
	_, _, began, _ := u.counts.last(kind)
	for {
		last, ok, _, changed := u.counts.last(kind)
		if ok && last.seq > began && refuse != nil {
			if err := refuse(last); err != nil {
				return nil, err
			}
		}
		select {
		case u.turn <- struct{}{}:
			return func() { <-u.turn }, nil
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// refusal is the open's refusal from last, a count under the lock made
// while it waited, when the open could only be refused: the student will
// not wait, takes no seat a class reserved, and no warm instance may
// serve them. nil otherwise, and the open is decided under the lock.
func (u *Usher) refusal(last counted, sess session.Session, lab labs.Lab, c Capacity, wait bool) error {
	if wait && u.waitlist != nil || u.warm(lab, false) || len(sess.Courses) > 0 && u.booked != nil {
		return nil
	}
	d := Decide(Input{Lab: lab.Name, Capacity: c, Used: last.used, Reserved: last.reserved, Waiting: last.waiting})
	if d.Verdict != Refuse {
		return nil
	}
	return fmt.Errorf("%w: %s", session.ErrNoCapacity, d.Reason)
}

// recordDecision records what the decision d under the lock counted in
// in, with its effect.
func (u *Usher) recordDecision(in Input, d Decision) {
	if in.CountFailed {
		return
	}
	c := counted{used: in.Used, reserved: in.Reserved, waiting: in.Waiting}
	switch d.Verdict {
	case Cold:
		c.used += in.Need
		if in.Seat {
			c.reserved = max(0, c.reserved-in.Need)
		}
	case Queue:
		c.waiting++
	}
	u.counts.record(in.Kind, c)
}
