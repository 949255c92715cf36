-- 011_headers: event headers and the trace context they carry. Applied like
-- 001 (search_path = the service's schema, as its role). Shipped: never
-- edit; add a later file instead.
--
-- outbox.HeadersDDL: the event's headers (outbox.Event.Headers, a JSON
-- object of strings; NULL when none), published with the row into the
-- stream entry. A nullable column without a default: nothing is rewritten.
ALTER TABLE outbox ADD COLUMN headers jsonb;

-- The W3C traceparent the message's stream entry carried (NULL when it
-- had none: tracing off on the sender), so that a gateway of any process
-- that reads the row from here, not from the worker's memory, ties its
-- push to the sender's trace. Only that one header is kept: the row is
-- read on every push, and the other headers are the handler's business.
ALTER TABLE inbox ADD COLUMN traceparent text;

-- The queue's reference of the delivery that stored the row (for redisq:
-- the stream entry id, whose first part is the milliseconds at which the
-- relay added it): `outboxchat trace` tells from it when the message was
-- published and which entry arrived, after the entry itself was trimmed.
ALTER TABLE inbox ADD COLUMN stream_id text;
