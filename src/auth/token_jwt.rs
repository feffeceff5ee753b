//! JWT tokens (etcd's auth/jwt.go and auth/options.go): `--auth-token
//! jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256[,ttl=5m]`. A token is a signed claim set
//! `{"username", "revision", "exp"}` (etcd's claim names), so it is stateless: any member with
//! the key verifies it, none remembers it.
//!
//! Invariants:
//! - Only the configured algorithm is accepted (a token signed otherwise is invalid), and `exp`
//!   is required and checked without leeway, as golang-jwt does for etcd.
//! - The keys are read and checked once, when the configuration is parsed: a member never
//!   starts with keys it cannot use. A member given only a public key verifies tokens but
//!   cannot issue them (etcd's verify-only member).
//! - The revision in a token is the auth revision it was issued at; the permission checks
//!   refuse it once the auth store has moved past it (etcd's ErrAuthOldRevision).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use super::store::AuthInfo;

/// etcd's default JWT `ttl` option.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(300);

/// Why a JWT option string or its keys cannot be used (etcd's auth errors for them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// A malformed option (not `name=value`, duplicated, unreadable, bad ttl).
    #[error("auth: invalid auth options ({0})")]
    InvalidOpts(String),
    #[error("auth: invalid auth signature method")]
    InvalidMethod,
    #[error("auth: missing key data")]
    MissingKey,
    #[error("auth: public and private keys don't match")]
    KeyMismatch,
    /// A key file that does not hold a key of the method's family.
    #[error("auth: bad key in {path}: {why}")]
    BadKey { path: String, why: String },
    /// Authenticate on a member that holds only the public key.
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
}

/// The parsed options, as given (compared when the configuration is compared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtOptions {
    pub sign_method: String,
    pub pub_key: Option<PathBuf>,
    pub priv_key: Option<PathBuf>,
    pub ttl: Duration,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

/// The JWT token provider of a member: its keys and options.
pub struct JwtTokens {
    pub opts: JwtOptions,
    alg: Algorithm,
    /// `None` on a verify-only member.
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
}

impl std::fmt::Debug for JwtTokens {
    // Never prints the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtTokens")
            .field("opts", &self.opts)
            .finish()
    }
}

impl PartialEq for JwtTokens {
    fn eq(&self, o: &Self) -> bool {
        self.opts == o.opts
    }
}
impl Eq for JwtTokens {}

/// etcd's decomposeOpts for the options after `jwt`: `name=value` pairs, none repeated.
fn decompose(opts: &[&str]) -> Result<BTreeMap<String, String>, JwtError> {
    let mut map = BTreeMap::new();
    for o in opts {
        let pair: Vec<&str> = o.split('=').collect();
        if pair.len() != 2 {
            return Err(JwtError::InvalidOpts(format!("{o:?} is not name=value")));
        }
        if map
            .insert(pair[0].to_string(), pair[1].to_string())
            .is_some()
        {
            return Err(JwtError::InvalidOpts(format!("{:?} is repeated", pair[0])));
        }
    }
    Ok(map)
}

/// The algorithms etcd 3.4 accepts that this JWT library implements: HMAC, RSA, RSA-PSS and
/// ECDSA P-256/P-384 (not ES512, which the library lacks).
fn algorithm(name: &str) -> Result<Algorithm, JwtError> {
    use Algorithm as A;
    Ok(match name {
        "HS256" => A::HS256,
        "HS384" => A::HS384,
        "HS512" => A::HS512,
        "RS256" => A::RS256,
        "RS384" => A::RS384,
        "RS512" => A::RS512,
        "PS256" => A::PS256,
        "PS384" => A::PS384,
        "PS512" => A::PS512,
        "ES256" => A::ES256,
        "ES384" => A::ES384,
        _ => return Err(JwtError::InvalidMethod),
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Family {
    Hmac,
    Rsa,
    Ec,
}

fn family(alg: Algorithm) -> Family {
    use Algorithm as A;
    match alg {
        A::HS256 | A::HS384 | A::HS512 => Family::Hmac,
        A::ES256 | A::ES384 => Family::Ec,
        _ => Family::Rsa,
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, JwtError> {
    std::fs::read(path).map_err(|e| JwtError::InvalidOpts(format!("{}: {e}", path.display())))
}

fn bad_key(path: &std::path::Path, e: impl std::fmt::Display) -> JwtError {
    JwtError::BadKey {
        path: path.display().to_string(),
        why: e.to_string(),
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl JwtTokens {
    /// Parses the options after `jwt,` (etcd's newTokenProviderJWT) and loads the keys.
    /// `parse_ttl` reads the `ttl` option (a Go duration, parsed by the configuration layer).
    /// Unknown options are ignored with a warning, as etcd does.
    pub fn from_options(
        opts: &[&str],
        parse_ttl: impl Fn(&str) -> Result<Duration, String>,
    ) -> Result<JwtTokens, JwtError> {
        let map = decompose(opts)?;
        let unknown: Vec<&String> = map
            .keys()
            .filter(|k| !["sign-method", "pub-key", "priv-key", "ttl"].contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "unknown JWT options");
        }
        let path = |k: &str| map.get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let ttl = match map.get("ttl").filter(|v| !v.is_empty()) {
            None => DEFAULT_JWT_TTL,
            Some(t) => parse_ttl(t).map_err(JwtError::InvalidOpts)?,
        };
        let opts = JwtOptions {
            sign_method: map.get("sign-method").cloned().unwrap_or_default(),
            pub_key: path("pub-key"),
            priv_key: path("priv-key"),
            ttl,
        };
        // etcd reads the key files before it checks the method.
        let pub_pem = opts.pub_key.as_deref().map(read).transpose()?;
        let priv_pem = opts.priv_key.as_deref().map(read).transpose()?;
        let alg = algorithm(&opts.sign_method)?;
        let fam = family(alg);
        let (signing, verifying) = match fam {
            Family::Hmac => {
                // The secret is the private key file's bytes, as etcd's hmacKey.
                let secret = priv_pem.ok_or(JwtError::MissingKey)?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            Family::Rsa | Family::Ec => {
                let decode = |pem: &[u8], path: &std::path::Path| {
                    if fam == Family::Rsa {
                        DecodingKey::from_rsa_pem(pem)
                    } else {
                        DecodingKey::from_ec_pem(pem)
                    }
                    .map_err(|e| bad_key(path, e))
                };
                let signing = match (&priv_pem, &opts.priv_key) {
                    (Some(pem), Some(p)) => Some(
                        if fam == Family::Rsa {
                            EncodingKey::from_rsa_pem(pem)
                        } else {
                            EncodingKey::from_ec_pem(pem)
                        }
                        .map_err(|e| bad_key(p, e))?,
                    ),
                    _ => None,
                };
                let verifying = match (&pub_pem, &opts.pub_key, &priv_pem, &opts.priv_key) {
                    (Some(pem), Some(p), _, _) => decode(pem, p)?,
                    // Only the private key: verify with its public half (PKCS#8 keys only).
                    (None, _, Some(pem), Some(p)) => {
                        let text = std::str::from_utf8(pem).map_err(|e| bad_key(p, e))?;
                        let pair = rcgen::KeyPair::from_pem(text).map_err(|e| {
                            bad_key(p, format!("{e} (give pub-key with a non-PKCS#8 key)"))
                        })?;
                        decode(pair.public_key_pem().as_bytes(), p)?
                    }
                    _ => return Err(JwtError::MissingKey),
                };
                (signing, verifying)
            }
        };
        let t = JwtTokens {
            opts,
            alg,
            signing,
            verifying,
        };
        // Both keys given: they must be one pair (etcd's ErrKeyMismatch). A probe token
        // signed with one and checked with the other tells, whatever the PEM flavours.
        if t.signing.is_some() && t.opts.pub_key.is_some() {
            let probe = t.assign("", 0)?;
            if t.info(&probe).is_none() {
                return Err(JwtError::KeyMismatch);
            }
        }
        Ok(t)
    }

    pub fn verify_only(&self) -> bool {
        self.signing.is_none()
    }

    /// A token for `username` at auth revision `revision`, valid for the ttl.
    pub fn assign(&self, username: &str, revision: u64) -> Result<String, JwtError> {
        let key = self.signing.as_ref().ok_or(JwtError::VerifyOnly)?;
        let claims = Claims {
            username: username.to_string(),
            revision,
            exp: now_secs() + self.opts.ttl.as_secs(),
        };
        jsonwebtoken::encode(&Header::new(self.alg), &claims, key).map_err(|e| JwtError::BadKey {
            path: self
                .opts
                .priv_key
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            why: e.to_string(),
        })
    }

    /// Who a token names, if it is well signed with this member's algorithm and key and has
    /// not expired (etcd's tokenJWT.info).
    pub fn info(&self, token: &str) -> Option<AuthInfo> {
        let mut v = Validation::new(self.alg);
        v.leeway = 0;
        v.set_required_spec_claims(&["exp"]);
        match jsonwebtoken::decode::<Claims>(token, &self.verifying, &v) {
            Ok(d) => Some(AuthInfo {
                username: d.claims.username,
                revision: d.claims.revision,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "invalid JWT token");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn tokens(opts: &[String]) -> Result<JwtTokens, JwtError> {
        let v: Vec<&str> = opts.iter().map(String::as_str).collect();
        JwtTokens::from_options(&v, |t| match t {
            "1m" => Ok(Duration::from_secs(60)),
            _ => Err(format!("bad ttl {t:?}")),
        })
    }

    #[test]
    fn sign_and_verify_with_each_family() {
        for (m, k) in [("RS256", "rsa"), ("PS384", "rsa"), ("ES256", "ec")] {
            let t = tokens(&[
                format!("sign-method={m}"),
                format!("pub-key={}", fixture(&format!("{k}-pub.pem"))),
                format!("priv-key={}", fixture(&format!("{k}-priv.pem"))),
            ])
            .unwrap();
            let tok = t.assign("alice", 7).unwrap();
            let ai = t.info(&tok).unwrap();
            assert_eq!((ai.username.as_str(), ai.revision), ("alice", 7));
            // Tampered: another payload under the same signature.
            let parts: Vec<&str> = tok.split('.').collect();
            let other = t.assign("root", 7).unwrap();
            let forged = format!(
                "{}.{}.{}",
                parts[0],
                other.split('.').nth(1).unwrap(),
                parts[2]
            );
            assert!(t.info(&forged).is_none(), "{m}");
        }
        // Private key only: verifies with its public half.
        let t = tokens(&[
            "sign-method=RS512".into(),
            format!("priv-key={}", fixture("rsa-priv.pem")),
        ])
        .unwrap();
        assert!(t.info(&t.assign("u", 1).unwrap()).is_some());
        // HMAC: the private key file is the secret.
        let h = tokens(&[
            "sign-method=HS256".into(),
            format!("priv-key={}", fixture("rsa-priv.pem")),
        ])
        .unwrap();
        assert!(h.info(&h.assign("u", 1).unwrap()).is_some());
        assert!(t.info(&h.assign("u", 1).unwrap()).is_none(), "other method");
    }

    #[test]
    fn verify_only_and_option_errors() {
        let v = tokens(&[
            "sign-method=RS256".into(),
            format!("pub-key={}", fixture("rsa-pub.pem")),
        ])
        .unwrap();
        assert!(v.verify_only());
        assert_eq!(v.assign("u", 1), Err(JwtError::VerifyOnly));
        assert_eq!(
            tokens(&["sign-method=RS256".into()]).unwrap_err(),
            JwtError::MissingKey
        );
        assert_eq!(
            tokens(&[
                "sign-method=XX1".into(),
                format!("pub-key={}", fixture("rsa-pub.pem"))
            ])
            .unwrap_err(),
            JwtError::InvalidMethod
        );
        assert!(matches!(
            tokens(&[
                "sign-method=RS256".into(),
                format!("pub-key={}", fixture("rsa-pub.pem")),
                format!("priv-key={}", fixture("ec-priv.pem")),
            ]),
            Err(JwtError::BadKey { .. })
        ));
        assert_eq!(
            tokens(&[
                "sign-method=RS256".into(),
                format!("pub-key={}", fixture("rsa-other-pub.pem")),
                format!("priv-key={}", fixture("rsa-priv.pem")),
            ])
            .unwrap_err(),
            JwtError::KeyMismatch
        );
        assert!(matches!(
            tokens(&["sign-method".into()]),
            Err(JwtError::InvalidOpts(_))
        ));
        assert!(matches!(
            tokens(&["ttl=1m".into(), "ttl=2m".into()]),
            Err(JwtError::InvalidOpts(_))
        ));
    }
}
