-- A course's reserved seats (reservation.Reservation), in one
-- environment's database (005). Each row keeps what a seat of its lab took
-- from which capacity when it was booked (kind, per_seat), so a lab that
-- changes or leaves the catalog never changes what was promised. A
-- cancelled reservation keeps its row (cancelled_at) for the record and
-- holds nothing. Bookings are checked and inserted under one transaction
-- lock (pgstore Reserve), so two at once can never pass the capacity.
CREATE TABLE reservations (
    id bigserial PRIMARY KEY,
    course text NOT NULL,
    lab text NOT NULL,
    seats integer NOT NULL CHECK (seats > 0),
    kind text NOT NULL,
    per_seat integer NOT NULL CHECK (per_seat >= 0),
    starts_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL CHECK (ends_at > starts_at),
    booked_by text NOT NULL,
    booked_at timestamptz NOT NULL,
    cancelled_at timestamptz
);
CREATE INDEX reservations_by_end ON reservations (ends_at) WHERE cancelled_at IS NULL;
