"""An OpenID Connect provider for people (SIP's `services.auth`, issue #47), and the login that uses it.

* `passwords`: the declared users' password hashes (bcrypt or argon2id), checked in constant time;
* `keys`: the provider's signing keys, born and kept on the machine that runs it, rotated on request;
* `provider`: the provider itself (Authlib on Flask, served by waitress behind a TLS front): discovery,
  JWKS, authorization with a login page (code flow, PKCE required), token (code, password, refresh) and
  userinfo;
* `login`: `gitops oidc-login`, the kubectl exec credential plugin that gets and caches an ID token.
"""
