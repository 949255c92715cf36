// Package gateway is the WebSocket hub of one service: a Gateway pushes a
// chat's messages, both sides', and its receipts to the live subscribers of
// its room.
//
// Invariant: every subscriber sees each message once and each side's in
// seq order. The gateway learns of new rows from Postgres (LISTEN, a poll
// fallback, a re-read after every reconnect) or, in its own process, from
// a handover after the commit (Offer, OfferApplied); every row is committed
// before the gateway hears of it and a subscriber catches up by seq, so a
// crash between a commit and a push loses nothing. Received messages
// behind a missing seq are held for Config.GapTimeout. A subscriber that
// falls Config.ClientBuffer frames behind is evicted and reconnects with
// its cursors: a slow client never blocks the others.
package gateway
