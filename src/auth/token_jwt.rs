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
    keys: Keys,
}

/// A member's keys; the signing key is `None` on a verify-only member.
enum Keys {
    /// The algorithms the `jsonwebtoken` crate implements.
    Lib {
        alg: Algorithm,
        signing: Option<EncodingKey>,
        verifying: DecodingKey,
    },
    /// ES512, which it does not (`jwt_es512`).
    Es512 {
        signing: Option<Box<p521::ecdsa::SigningKey>>,
        verifying: Box<p521::ecdsa::VerifyingKey>,
    },
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

/// The algorithms etcd 3.4 accepts that the JWT library implements: HMAC, RSA, RSA-PSS and
/// ECDSA P-256/P-384 (ES512 is `jwt_es512`'s).
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

/// ES512 keys from the PEM files given: a verify-only member without `priv-key`; with it
/// alone, verification uses its public half.
fn es512_keys(
    opts: &JwtOptions,
    pub_pem: Option<&[u8]>,
    priv_pem: Option<&[u8]>,
) -> Result<Keys, JwtError> {
    use super::jwt_es512::{signing_key, verifying_key};
    use super::jwt_pem::{private_pkcs8, public_spki};
    let signing = match (priv_pem, &opts.priv_key) {
        (Some(pem), Some(p)) => Some(Box::new(
            private_pkcs8(pem)
                .and_then(|pem| signing_key(&pem))
                .map_err(|e| bad_key(p, e))?,
        )),
        _ => None,
    };
    let verifying = match (pub_pem, &opts.pub_key, &signing) {
        (Some(pem), Some(p), _) => Box::new(
            public_spki(pem)
                .and_then(|pem| verifying_key(&pem))
                .map_err(|e| bad_key(p, e))?,
        ),
        (None, _, Some(s)) => Box::new(p521::ecdsa::VerifyingKey::from(&**s)),
        _ => return Err(JwtError::MissingKey),
    };
    Ok(Keys::Es512 { signing, verifying })
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
        if opts.sign_method == "ES512" {
            let keys = es512_keys(&opts, pub_pem.as_deref(), priv_pem.as_deref())?;
            return JwtTokens { opts, keys }.checked();
        }
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
                    let pem = super::jwt_pem::public_spki(pem).map_err(|e| bad_key(path, e))?;
                    if fam == Family::Rsa {
                        DecodingKey::from_rsa_pem(pem.as_bytes())
                    } else {
                        DecodingKey::from_ec_pem(pem.as_bytes())
                    }
                    .map_err(|e| bad_key(path, e))
                };
                // PKCS#1 and SEC1 keys as etcd reads them: as PKCS#8, which both the signer
                // and the public-half derivation below take.
                let priv_pem = match (&priv_pem, &opts.priv_key) {
                    (Some(pem), Some(p)) => {
                        Some(super::jwt_pem::private_pkcs8(pem).map_err(|e| bad_key(p, e))?)
                    }
                    _ => None,
                };
                let signing = match (&priv_pem, &opts.priv_key) {
                    (Some(pem), Some(p)) => Some(
                        if fam == Family::Rsa {
                            EncodingKey::from_rsa_pem(pem.as_bytes())
                        } else {
                            EncodingKey::from_ec_pem(pem.as_bytes())
                        }
                        .map_err(|e| bad_key(p, e))?,
                    ),
                    _ => None,
                };
                let verifying = match (&pub_pem, &opts.pub_key, &priv_pem, &opts.priv_key) {
                    (Some(pem), Some(p), _, _) => decode(pem, p)?,
                    // Only the private key: verify with its public half.
                    (None, _, Some(pem), Some(p)) => {
                        let pair = rcgen::KeyPair::from_pem(pem).map_err(|e| bad_key(p, e))?;
                        decode(pair.public_key_pem().as_bytes(), p)?
                    }
                    _ => return Err(JwtError::MissingKey),
                };
                (signing, verifying)
            }
        };
        JwtTokens {
            opts,
            keys: Keys::Lib {
                alg,
                signing,
                verifying,
            },
        }
        .checked()
    }

    /// A probe token, signed and checked: a private key the method cannot sign with (a P-384
    /// key for ES256) is refused here, where etcd starts and fails each Authenticate. With
    /// both keys given they must be one pair (etcd's ErrKeyMismatch), whatever the PEM forms.
    fn checked(self) -> Result<JwtTokens, JwtError> {
        if !self.verify_only() {
            let probe = self.assign("", 0)?;
            if self.info(&probe).is_none() {
                return Err(JwtError::KeyMismatch);
            }
        }
        Ok(self)
    }

    pub fn verify_only(&self) -> bool {
        match &self.keys {
            Keys::Lib { signing, .. } => signing.is_none(),
            Keys::Es512 { signing, .. } => signing.is_none(),
        }
    }

    /// A token for `username` at auth revision `revision`, valid for the ttl.
    pub fn assign(&self, username: &str, revision: u64) -> Result<String, JwtError> {
        let claims = Claims {
            username: username.to_string(),
            revision,
            exp: now_secs() + self.opts.ttl.as_secs(),
        };
        let signed = match &self.keys {
            Keys::Lib { alg, signing, .. } => {
                let key = signing.as_ref().ok_or(JwtError::VerifyOnly)?;
                jsonwebtoken::encode(&Header::new(*alg), &claims, key).map_err(|e| e.to_string())
            }
            Keys::Es512 { signing, .. } => {
                let key = signing.as_ref().ok_or(JwtError::VerifyOnly)?;
                super::jwt_es512::encode(&claims, key)
            }
        };
        signed.map_err(|why| JwtError::BadKey {
            path: self
                .opts
                .priv_key
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            why,
        })
    }

    /// Who a token names, if it is well signed with this member's algorithm and key and has
    /// not expired (etcd's tokenJWT.info).
    pub fn info(&self, token: &str) -> Option<AuthInfo> {
        let claims = match &self.keys {
            Keys::Lib { alg, verifying, .. } => {
                let mut v = Validation::new(*alg);
                v.leeway = 0;
                v.set_required_spec_claims(&["exp"]);
                jsonwebtoken::decode::<Claims>(token, verifying, &v)
                    .map(|d| d.claims)
                    .map_err(|e| e.to_string())
            }
            // `exp` is a required field of the claims; expired once past (no leeway), as
            // the library checks it.
            Keys::Es512 { verifying, .. } => super::jwt_es512::decode::<Claims>(token, verifying)
                .and_then(|c| {
                    if c.exp < now_secs() {
                        Err("ExpiredSignature".to_string())
                    } else {
                        Ok(c)
                    }
                }),
        };
        match claims {
            Ok(c) => Some(AuthInfo {
                username: c.username,
                revision: c.revision,
            }),
            Err(error) => {
                tracing::warn!(%error, "invalid JWT token");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;

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

    /// `tok` with the claims of another token `t` signs (root's) under its own signature.
    fn forged(t: &JwtTokens, tok: &str) -> String {
        let parts: Vec<&str> = tok.split('.').collect();
        let other = t.assign("root", 7).unwrap();
        let claims = other.split('.').nth(1).unwrap();
        format!("{}.{claims}.{}", parts[0], parts[2])
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
            assert!(t.info(&forged(&t, &tok)).is_none(), "{m}");
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

    /// The key files etcd reads (golang-jwt): PKCS#1 RSA and SEC1 EC private keys, alone or
    /// with their public key, and a certificate as the public key.
    #[test]
    fn etcd_key_forms_sign_and_verify() {
        for (m, priv_key, pub_key) in [
            ("RS256", "rsa-priv-pkcs1.pem", Some("rsa-pub.pem")),
            ("RS256", "rsa-priv-pkcs1.pem", None),
            ("ES256", "ec-priv-sec1.pem", Some("ec-pub.pem")),
            ("ES256", "ec-priv-sec1.pem", None),
            ("ES256", "ec-priv-sec1.pem", Some("ec-cert.pem")),
            ("ES384", "ec384-priv-sec1.pem", Some("ec384-pub.pem")),
            ("ES384", "ec384-priv-sec1.pem", None),
            ("ES384", "ec384-priv.pem", None),
            ("ES512", "ec512-priv.pem", Some("ec512-cert.pem")),
            ("RS256", "rsa-priv.pem", Some("rsa-cert.pem")),
        ] {
            let mut o = vec![
                format!("sign-method={m}"),
                format!("priv-key={}", fixture(priv_key)),
            ];
            o.extend(pub_key.map(|k| format!("pub-key={}", fixture(k))));
            let t = tokens(&o).unwrap_or_else(|e| panic!("{m} {priv_key} {pub_key:?}: {e}"));
            let ai = t.info(&t.assign("alice", 3).unwrap()).unwrap();
            assert_eq!((ai.username.as_str(), ai.revision), ("alice", 3));
        }
        // A SEC1 key with another key's public half, or on another curve than the method's.
        let mismatch = tokens(&[
            "sign-method=ES256".into(),
            format!("priv-key={}", fixture("ec-priv-sec1.pem")),
            format!("pub-key={}", fixture("ec384-pub.pem")),
        ]);
        assert!(mismatch.is_err());
        let curve = tokens(&[
            "sign-method=ES256".into(),
            format!("priv-key={}", fixture("ec384-priv-sec1.pem")),
        ]);
        assert!(matches!(curve, Err(JwtError::BadKey { .. })), "{curve:?}");
        // etcd reads the first PEM block only: `openssl ecparam -genkey` without `-noout`.
        let params = tokens(&[
            "sign-method=ES256".into(),
            format!("priv-key={}", fixture("ec-priv-with-params.pem")),
        ]);
        assert!(matches!(params, Err(JwtError::BadKey { .. })), "{params:?}");
    }

    #[test]
    fn es512_signs_verifies_and_checks_its_keys() {
        let es = |pub_key: Option<&str>, priv_key: Option<&str>| {
            let mut o = vec!["sign-method=ES512".to_string()];
            o.extend(pub_key.map(|k| format!("pub-key={}", fixture(k))));
            o.extend(priv_key.map(|k| format!("priv-key={}", fixture(k))));
            tokens(&o)
        };
        // SEC1 and PKCS#8 private keys; with the public key, or alone.
        for priv_key in ["ec512-priv.pem", "ec512-priv-pkcs8.pem"] {
            for pub_key in [Some("ec512-pub.pem"), None] {
                let t = es(pub_key, Some(priv_key)).unwrap();
                let tok = t.assign("alice", 7).unwrap();
                let sig = tok.rsplit('.').next().unwrap();
                assert_eq!(B64.decode(sig).unwrap().len(), 132, "r || s, 66 bytes each");
                let ai = t.info(&tok).unwrap();
                assert_eq!((ai.username.as_str(), ai.revision), ("alice", 7));
            }
        }
        let t = es(Some("ec512-pub.pem"), Some("ec512-priv.pem")).unwrap();
        let tok = t.assign("alice", 7).unwrap();
        let parts: Vec<&str> = tok.split('.').collect();
        assert!(t.info(&forged(&t, &tok)).is_none());
        // The same claims and signature under a header naming another algorithm.
        let none = B64.encode(r#"{"alg":"none","typ":"JWT"}"#);
        assert!(t
            .info(&format!("{none}.{}.{}", parts[1], parts[2]))
            .is_none());
        // Expired: a token signed now with an `exp` in the past.
        let Keys::Es512 {
            signing: Some(key), ..
        } = &t.keys
        else {
            unreachable!()
        };
        let old = Claims {
            username: "alice".into(),
            revision: 7,
            exp: now_secs() - 1,
        };
        let expired = crate::auth::jwt_es512::encode(&old, key).unwrap();
        assert!(t.info(&expired).is_none());
        // A verify-only member checks tokens but makes none.
        let v = es(Some("ec512-pub.pem"), None).unwrap();
        assert!(v.verify_only());
        assert!(v.info(&tok).is_some());
        assert_eq!(v.assign("u", 1), Err(JwtError::VerifyOnly));
        // Keys that are not a pair, keys of another curve, and none at all.
        assert_eq!(
            es(Some("ec512-other-pub.pem"), Some("ec512-priv.pem")).unwrap_err(),
            JwtError::KeyMismatch
        );
        assert!(es(Some("ec512-other-pub.pem"), None)
            .unwrap()
            .info(&tok)
            .is_none());
        for (pub_key, priv_key) in [
            (None, Some("ec-priv.pem")),
            (Some("ec-pub.pem"), None),
            (None, Some("rsa-priv.pem")),
        ] {
            assert!(
                matches!(es(pub_key, priv_key), Err(JwtError::BadKey { .. })),
                "{pub_key:?} {priv_key:?}"
            );
        }
        assert_eq!(es(None, None).unwrap_err(), JwtError::MissingKey);
        // An ES256 member refuses an ES512 token, and the other way round.
        let es256 = tokens(&[
            "sign-method=ES256".into(),
            format!("pub-key={}", fixture("ec-pub.pem")),
            format!("priv-key={}", fixture("ec-priv.pem")),
        ])
        .unwrap();
        assert!(es256.info(&tok).is_none());
        assert!(t.info(&es256.assign("u", 1).unwrap()).is_none());
    }

    #[test]
    fn es512_token_made_by_etcd_verifies() {
        // Made by etcd 3.4 with these keys (`--auth-token jwt,...,sign-method=ES512,
        // ttl=876000h`) after user add root, role add root, grant and auth enable.
        let tok = std::fs::read_to_string(fixture("etcd-es512.token")).unwrap();
        let t = tokens(&[
            "sign-method=ES512".into(),
            format!("pub-key={}", fixture("ec512-pub.pem")),
        ])
        .unwrap();
        let ai = t.info(tok.trim()).expect("etcd's token verifies");
        assert_eq!((ai.username.as_str(), ai.revision), ("root", 4));
        let other = tokens(&[
            "sign-method=ES512".into(),
            format!("pub-key={}", fixture("ec512-other-pub.pem")),
        ])
        .unwrap();
        assert!(other.info(tok.trim()).is_none());
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
