// Package auth is who may do what: bearer tokens (HS256 with a shared
// secret, or RS256/ES256 keys from a JWKS file) checked by a Verifier into a
// Principal (user, chats, expiry) that travels in the request's context
// (WithPrincipal, PrincipalOf, AuthorOf), tokens minted for development and
// operators (MintToken), and the HMAC keys that sign the stream entries a
// relay publishes and let the receiving worker refuse forged ones
// (EventKeys). It has no HTTP handlers: package httpapi applies it.
package auth
