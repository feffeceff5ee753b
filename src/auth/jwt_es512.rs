//! ES512 JWTs (ECDSA over P-521 with SHA-512), which etcd accepts through golang-jwt and the
//! `jsonwebtoken` crate does not implement: the token is assembled here, the cryptography is
//! RustCrypto's `p521`.
//!
//! Invariants (golang-jwt's, as etcd uses it):
//! - A token is `base64url(header).base64url(claims).base64url(signature)`, unpadded; the
//!   signature is `r || s`, each 66 bytes big-endian, over the first two parts.
//! - A token verifies only if its header names `ES512` (no other algorithm, no `none`), the
//!   signature is exactly 132 bytes and valid, and the claims parse; the caller checks `exp`.
//! - Private keys are PKCS#8 (`PRIVATE KEY`) PEM, public keys SubjectPublicKeyInfo
//!   (`PUBLIC KEY`) PEM, both on P-521; any other curve is a bad key. `jwt_pem` turns the
//!   other forms etcd reads into these.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use p521::ecdsa::signature::{Signer, Verifier};
use p521::ecdsa::{Signature, SigningKey, VerifyingKey};
use p521::pkcs8::{DecodePrivateKey, DecodePublicKey};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The header every ES512 token carries (golang-jwt's, fields in its order).
const HEADER: &str = r#"{"alg":"ES512","typ":"JWT"}"#;

/// A private key from PKCS#8 PEM.
pub fn signing_key(pem: &str) -> Result<SigningKey, String> {
    let secret =
        p521::SecretKey::from_pkcs8_pem(pem).map_err(|e| format!("not a P-521 key: {e}"))?;
    SigningKey::from_bytes(&secret.to_bytes()).map_err(|e| e.to_string())
}

/// A public key from SubjectPublicKeyInfo PEM.
pub fn verifying_key(pem: &str) -> Result<VerifyingKey, String> {
    let public = p521::PublicKey::from_public_key_pem(pem)
        .map_err(|e| format!("not a P-521 public key: {e}"))?;
    VerifyingKey::from_affine(*public.as_affine()).map_err(|e| e.to_string())
}

/// A signed token carrying `claims`.
pub fn encode(claims: &impl Serialize, key: &SigningKey) -> Result<String, String> {
    let claims = serde_json::to_vec(claims).map_err(|e| e.to_string())?;
    let signed = format!("{}.{}", B64.encode(HEADER), B64.encode(claims));
    let sig: Signature = key.try_sign(signed.as_bytes()).map_err(|e| e.to_string())?;
    Ok(format!("{signed}.{}", B64.encode(sig.to_bytes())))
}

/// The claims of `token` if it is an ES512 token signed with `key`'s pair; why not otherwise.
pub fn decode<T: DeserializeOwned>(token: &str, key: &VerifyingKey) -> Result<T, String> {
    let (signed, sig) = token.rsplit_once('.').ok_or("not a JWT")?;
    let (header, claims) = signed.split_once('.').ok_or("not a JWT")?;
    #[derive(serde::Deserialize)]
    struct Header {
        alg: String,
    }
    let h: Header = serde_json::from_slice(&B64.decode(header).map_err(|e| e.to_string())?)
        .map_err(|e| format!("bad header: {e}"))?;
    if h.alg != "ES512" {
        return Err(format!("signing method {:?} is not ES512", h.alg));
    }
    let sig = B64.decode(sig).map_err(|e| e.to_string())?;
    let sig = Signature::from_slice(&sig).map_err(|_| "bad signature length")?;
    key.verify(signed.as_bytes(), &sig)
        .map_err(|_| "signature does not verify")?;
    serde_json::from_slice(&B64.decode(claims).map_err(|e| e.to_string())?)
        .map_err(|e| format!("bad claims: {e}"))
}
