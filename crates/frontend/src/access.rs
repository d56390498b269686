//! Who calls a front door, when the agent has tenants: the bearer token
//! of a call (`Authorization: Bearer TOKEN`, an HTTP header or gRPC
//! metadata), the caller's [`Seat`] among the tenants, and the checks the
//! doors make with it.
//!
//! Without a tenants file nothing here refuses anything: every caller
//! holds no seat, the `Authorization` header is not even read, and every
//! call works as it always did.
//!
//! With one, each call is seated on its own ([`Tenants::request_seat`]:
//! not counted as a connection, since a front-door call has no session):
//!
//! - no `Authorization`: the `default` tenant's rights (none unless the
//!   tenants file declares a tenant named `default`);
//! - `Bearer TOKEN` whose SHA-256 a tenant lists: that tenant;
//! - a token no tenant lists: refused, `UNAUTHENTICATED` (HTTP 401);
//! - a malformed header (not `Bearer`, no token, a token over
//!   [`MAX_TOKEN_BYTES`] or with bytes other than visible ASCII, or two
//!   `Authorization` headers): refused, `INVALID_ARGUMENT` (HTTP 400).
//!
//! A model the tenant may not use is refused with `PERMISSION_DENIED`
//! (HTTP 403) naming the model and the tenant, whether or not the agent
//! serves it (so a tenant cannot probe for other tenants' models), and
//! counted in the tenant's `denied`. Lists (the repository index, every
//! model's statistics, the served models named in a NOT_FOUND message)
//! hold only what the tenant may use. Loading and unloading models and
//! registering or unregistering shared-memory regions change the agent
//! for every tenant: they are allowed only to a tenant whose `models` is
//! `["*"]` ([`is_operator`]).
//!
//! The token is never logged, nor put in any message.

use server::dispatch::AgentCore;
use server::tenants::{Identity, Seat, Tenants};
use std::sync::atomic::Ordering;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The longest bearer token accepted, in bytes.
pub(crate) const MAX_TOKEN_BYTES: usize = 1024;

/// The name of the header (and of the gRPC metadata key) that carries the
/// token.
pub(crate) const AUTHORIZATION: &str = "authorization";

/// The token of a call from its `Authorization` values (none, or one
/// `Bearer TOKEN`). The scheme is matched without regard to case, as
/// RFC 9110 says; one or more spaces separate it from the token.
pub(crate) fn bearer<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<&'a [u8]>, Status> {
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Status::invalid_argument(
            "the call has more than one Authorization header; send one: 'Bearer TOKEN'",
        ));
    }
    let bad = |why: &str| {
        Status::invalid_argument(format!(
            "malformed Authorization header: {why} (expected 'Bearer TOKEN', the token 1..={MAX_TOKEN_BYTES} bytes of visible ASCII)"
        ))
    };
    let scheme_len = "Bearer".len();
    let scheme = value.get(..scheme_len).unwrap_or(value);
    if !scheme.eq_ignore_ascii_case(b"Bearer") {
        return Err(bad("its scheme is not 'Bearer'"));
    }
    let rest = &value[scheme.len()..];
    let token = rest.trim_ascii_start();
    if token.len() == rest.len() && !rest.is_empty() {
        return Err(bad("its scheme is not 'Bearer'"));
    }
    let token = token.trim_ascii_end();
    if token.is_empty() {
        return Err(bad("it carries no token"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(bad(&format!("its token is {} bytes", token.len())));
    }
    if !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err(bad("its token holds bytes other than visible ASCII"));
    }
    Ok(Some(token))
}

/// The `authorization` values of a gRPC call's metadata.
pub(crate) fn grpc_authorization(md: &MetadataMap) -> Vec<&[u8]> {
    md.get_all(AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes())
        .collect()
}

/// The seat of a call with these `Authorization` values: none when the
/// agent has no tenants (the values are not read then), else the tenant
/// its token names, or the `default` tenant without a token.
pub(crate) fn seat<'a>(
    core: &AgentCore,
    authorization: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Seat>, Status> {
    if core.tenants().is_none() {
        return Ok(None);
    }
    seat_for_token(core, bearer(authorization.into_iter())?)
}

/// The token of a call with these `Authorization` values, owned (for a
/// stream, whose requests are seated one by one); none without tenants.
pub(crate) fn token<'a>(
    core: &AgentCore,
    authorization: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Vec<u8>>, Status> {
    if core.tenants().is_none() {
        return Ok(None);
    }
    Ok(bearer(authorization.into_iter())?.map(<[u8]>::to_vec))
}

/// The seat of a call presenting `token` (already parsed): none when the
/// agent has no tenants.
pub(crate) fn seat_for_token(
    core: &AgentCore,
    token: Option<&[u8]>,
) -> Result<Option<Seat>, Status> {
    match core.tenants() {
        None => Ok(None),
        Some(tenants) => seat_in(tenants, token).map(Some),
    }
}

/// The seat of a call presenting `token` among `tenants`.
fn seat_in(tenants: &std::sync::Arc<Tenants>, token: Option<&[u8]>) -> Result<Seat, Status> {
    tenants
        .request_seat(&Identity::REMOTE, token)
        .map_err(|(_, message)| {
            if token.is_some() {
                Status::unauthenticated(message)
            } else {
                Status::permission_denied(message)
            }
        })
}

/// The name of the seat's tenant, for messages.
fn tenant_name(seat: &Seat) -> String {
    seat.tenant_name()
}

/// Counts a refusal for lack of rights in the seat's tenant.
fn count_denied(seat: &Seat) {
    if let Ok(t) = seat.tenant() {
        t.usage.denied.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether the caller may see and use model `name` (always, without a
/// seat).
pub(crate) fn may_see(seat: Option<&Seat>, name: &str) -> bool {
    seat.is_none_or(|s| s.may_see(name))
}

/// Refuses model `name` to a caller whose tenant may not use it
/// (`PERMISSION_DENIED`, counted in the tenant's `denied`).
pub(crate) fn check_model(seat: Option<&Seat>, name: &str) -> Result<(), Status> {
    match seat {
        Some(s) if !s.may_see(name) => {
            count_denied(s);
            Err(Status::permission_denied(format!(
                "tenant '{}' may not use model '{name}' (see the agent's tenants file)",
                tenant_name(s)
            )))
        }
        _ => Ok(()),
    }
}

/// Whether the seat's tenant may use every model (`models = ["*"]`: the
/// tenants file turns a `"*"` into "all models", and allows it only
/// alone, so `may_use("*")` holds for exactly those tenants).
pub(crate) fn is_operator(seat: &Seat) -> bool {
    seat.tenant().is_ok_and(|t| t.may_use("*"))
}

/// Refuses `what` (an action that changes the agent for every tenant) to
/// a caller whose tenant may not use every model (`PERMISSION_DENIED`,
/// counted in the tenant's `denied`). Allowed to everyone without tenants.
pub(crate) fn check_operator(seat: Option<&Seat>, what: &str) -> Result<(), Status> {
    match seat {
        Some(s) if !is_operator(s) => {
            count_denied(s);
            Err(Status::permission_denied(format!(
                "tenant '{}' may not {what}: only a tenant whose models are [\"*\"] may \
                 (see the agent's tenants file)",
                tenant_name(s)
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use server::tenants::file;
    use server::ModelRegistry;
    use std::sync::Arc;
    use tonic::Code;
    use wire::Limits;

    fn one(v: &[u8]) -> Result<Option<&[u8]>, Status> {
        bearer(std::iter::once(v))
    }

    #[test]
    fn bearer_tokens_are_parsed_and_malformed_ones_refused() {
        assert_eq!(bearer(std::iter::empty()).expect("none"), None);
        assert_eq!(one(b"Bearer abc").expect("ok"), Some(&b"abc"[..]));
        assert_eq!(
            one(b"bearer  a.b-c_d~+/=").expect("ok"),
            Some(&b"a.b-c_d~+/="[..])
        );
        assert_eq!(one(b"BEARER x ").expect("ok"), Some(&b"x"[..]));
        let long = format!("Bearer {}", "t".repeat(MAX_TOKEN_BYTES));
        assert_eq!(
            one(long.as_bytes()).expect("the longest").map(<[u8]>::len),
            Some(MAX_TOKEN_BYTES)
        );
        let too_long = format!("Bearer {}", "t".repeat(MAX_TOKEN_BYTES + 1));
        for (v, needle) in [
            (&b"Basic dXNlcjpwYXNz"[..], "not 'Bearer'"),
            (b"Bearerabc", "not 'Bearer'"),
            (b"Bear", "not 'Bearer'"),
            (b"", "not 'Bearer'"),
            (b"Bearer", "no token"),
            (b"Bearer    ", "no token"),
            (too_long.as_bytes(), "1025 bytes"),
            (b"Bearer a b", "visible ASCII"),
            ("Bearer t\u{e9}".as_bytes(), "visible ASCII"),
            (b"Bearer a\x01", "visible ASCII"),
        ] {
            let e = one(v).expect_err("refused");
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains(needle), "{:?}: {}", v, e.message());
        }
        let e = bearer([&b"Bearer a"[..], b"Bearer b"].into_iter()).expect_err("two");
        assert!(e.message().contains("more than one"), "{}", e.message());
    }

    #[test]
    fn the_token_is_never_in_a_message() {
        let secret = "s3cr3t-T0KEN";
        for v in [format!("Bearer {secret} x"), format!("Token {secret}")] {
            let e = one(v.as_bytes()).expect_err("refused");
            assert!(!e.message().contains(secret), "{}", e.message());
        }
        let tenants = Arc::new(Tenants::from_specs(
            file::parse("[[tenant]]\nname = \"a\"\nmodels = [\"*\"]\n", "t.toml").expect("file"),
        ));
        let e = seat_in(&tenants, Some(secret.as_bytes())).expect_err("unknown");
        assert_eq!(e.code(), Code::Unauthenticated);
        assert!(!e.message().contains(secret), "{}", e.message());
    }

    fn hex(token: &str) -> String {
        server::tenants::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn core_with(text: &str) -> AgentCore {
        let tenants = Tenants::from_specs(file::parse(text, "t.toml").expect("file"));
        AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1 << 20)
            .with_tenants(Some(Arc::new(tenants)))
    }

    #[test]
    fn seats_rights_and_operators() {
        let core = core_with(&format!(
            "[[tenant]]\nname = \"ops\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"*\"]\n\
             [[tenant]]\nname = \"app\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n",
            hex("op"),
            hex("ap")
        ));
        let ops = seat(&core, [&b"Bearer op"[..]])
            .expect("ops")
            .expect("a seat");
        let app = seat(&core, [&b"Bearer ap"[..]])
            .expect("app")
            .expect("a seat");
        let anon = seat(&core, []).expect("default").expect("a seat");
        assert_eq!(anon.tenant_name(), "default");
        assert!(check_model(Some(&app), "identity").is_ok());
        let e = check_model(Some(&app), "other").expect_err("not its model");
        assert_eq!(e.code(), Code::PermissionDenied);
        assert!(
            e.message()
                .contains("tenant 'app' may not use model 'other'"),
            "{}",
            e.message()
        );
        let e = check_model(Some(&anon), "identity").expect_err("default: nothing");
        assert!(e.message().contains("tenant 'default'"), "{}", e.message());
        assert!(is_operator(&ops) && !is_operator(&app));
        assert!(check_operator(Some(&ops), "load models").is_ok());
        let e = check_operator(Some(&app), "load models").expect_err("not an operator");
        assert_eq!(e.code(), Code::PermissionDenied);
        assert!(
            e.message().contains("tenant 'app' may not load models"),
            "{}",
            e.message()
        );
        let denied = |name: &str| {
            core.tenants()
                .expect("tenants")
                .snapshot()
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| t.denied)
        };
        assert_eq!(denied("app"), Some(2));
        assert_eq!(denied("default"), Some(1));
        let e = seat(&core, [&b"Bearer nope"[..]]).expect_err("unknown token");
        assert_eq!(e.code(), Code::Unauthenticated);
        let e = seat(&core, [&b"Basic x"[..]]).expect_err("malformed");
        assert_eq!(e.code(), Code::InvalidArgument);
    }

    #[test]
    fn without_tenants_nothing_is_read_or_refused() {
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1 << 20);
        assert!(seat(&core, [&b"not even a bearer"[..]])
            .expect("open")
            .is_none());
        assert!(check_model(None, "anything").is_ok());
        assert!(check_operator(None, "load models").is_ok());
        assert!(may_see(None, "anything"));
    }
}
