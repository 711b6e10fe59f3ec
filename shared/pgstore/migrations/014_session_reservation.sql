-- The reservation whose seat a session took (session.Session.Reservation;
-- NULL for a session in the general line). A reservation's seats taken are
-- its live sessions: this index counts them for the reservations standing
-- now, under the capacity lock, without a scan of every session.
ALTER TABLE sessions ADD COLUMN reservation_id bigint REFERENCES reservations (id);
CREATE INDEX sessions_by_reservation ON sessions (reservation_id) WHERE reservation_id IS NOT NULL AND status IN ('provisioning', 'running');
