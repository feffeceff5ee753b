//! JWT key files in each PEM form etcd reads, rewritten as the one form the key libraries
//! here read: PKCS#8 for private keys, SubjectPublicKeyInfo for public ones.
//!
//! etcd parses keys with golang-jwt, which takes the file's first PEM block: a private key as
//! PKCS#1 (`RSA PRIVATE KEY`, `openssl genrsa -traditional`), SEC1 (`EC PRIVATE KEY`,
//! `openssl ecparam -genkey -noout`) or PKCS#8 (`PRIVATE KEY`); a public key as
//! SubjectPublicKeyInfo (`PUBLIC KEY`) or a certificate's. `jsonwebtoken` does not sign with
//! SEC1 keys, deriving the public half (for a member given only the private key) takes
//! PKCS#8, and `p521` reads neither certificates nor PKCS#1.
//!
//! Invariants:
//! - Only the file's first PEM block is read, as etcd does: a file that starts with an
//!   `EC PARAMETERS` block is refused by both.
//! - A rewrite only wraps the DER it was given in a PKCS#8 envelope naming its algorithm (and
//!   for SEC1, the curve the key names); the key itself is checked by the library that uses
//!   it, so a broken key is refused there with its own error.

use pkcs8::der::asn1::AnyRef;
use pkcs8::der::Encode;
use pkcs8::spki::{AlgorithmIdentifierRef, ObjectIdentifier};
use pkcs8::PrivateKeyInfo;

/// rsaEncryption (RFC 8017), whose parameters are NULL.
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
/// id-ecPublicKey (RFC 5480), whose parameters name the curve.
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");

/// The private key in `pem` as PKCS#8 PEM.
pub fn private_pkcs8(pem: &[u8]) -> Result<String, String> {
    let block = pem::parse(pem).map_err(|e| format!("not PEM: {e}"))?;
    let der = block.contents();
    let wrapped = match block.tag() {
        "PRIVATE KEY" => return Ok(pem::encode(&block)),
        "RSA PRIVATE KEY" => wrap(RSA_ENCRYPTION, AnyRef::NULL, der)?,
        "EC PRIVATE KEY" => {
            let key =
                sec1::EcPrivateKey::try_from(der).map_err(|e| format!("bad SEC1 key: {e}"))?;
            let curve = key
                .parameters
                .and_then(|p| p.named_curve())
                .ok_or("a SEC1 key that does not name its curve")?;
            wrap(EC_PUBLIC_KEY, AnyRef::from(&curve), der)?
        }
        other => {
            return Err(format!(
                "the first PEM block is {other:?}, not a private key"
            ))
        }
    };
    Ok(pem::encode(&pem::Pem::new("PRIVATE KEY", wrapped)))
}

/// The public key in `pem` as SubjectPublicKeyInfo PEM. PKCS#1 `RSA PUBLIC KEY` passes
/// through too (etcd refuses it; `jsonwebtoken` reads it, and refusing it would help no one).
pub fn public_spki(pem: &[u8]) -> Result<String, String> {
    let block = pem::parse(pem).map_err(|e| format!("not PEM: {e}"))?;
    match block.tag() {
        "PUBLIC KEY" | "RSA PUBLIC KEY" => Ok(pem::encode(&block)),
        "CERTIFICATE" => {
            let (_, cert) = x509_parser::parse_x509_certificate(block.contents())
                .map_err(|e| format!("bad certificate: {e}"))?;
            let spki = cert.public_key().raw.to_vec();
            Ok(pem::encode(&pem::Pem::new("PUBLIC KEY", spki)))
        }
        other => Err(format!(
            "the first PEM block is {other:?}, not a public key"
        )),
    }
}

fn wrap(oid: ObjectIdentifier, parameters: AnyRef<'_>, key: &[u8]) -> Result<Vec<u8>, String> {
    let algorithm = AlgorithmIdentifierRef {
        oid,
        parameters: Some(parameters),
    };
    PrivateKeyInfo::new(algorithm, key)
        .to_der()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/tests/fixtures/jwt/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    /// Each traditional form becomes PKCS#8 that a PKCS#8-only parser reads, with the same key.
    #[test]
    fn traditional_keys_become_pkcs8() {
        for (traditional, pkcs8) in [
            ("rsa-priv-pkcs1.pem", "rsa-priv.pem"),
            ("ec-priv-sec1.pem", "ec-priv.pem"),
            ("ec384-priv-sec1.pem", "ec384-priv.pem"),
        ] {
            let ours = private_pkcs8(&fixture(traditional)).unwrap();
            assert!(
                ours.starts_with("-----BEGIN PRIVATE KEY-----"),
                "{traditional}"
            );
            let ours = rcgen::KeyPair::from_pem(&ours).expect(traditional);
            let theirs = String::from_utf8(fixture(pkcs8)).unwrap();
            let theirs = rcgen::KeyPair::from_pem(&theirs).expect(pkcs8);
            assert_eq!(
                ours.public_key_der(),
                theirs.public_key_der(),
                "{traditional}"
            );
        }
        // PKCS#8 passes through.
        let p8 = private_pkcs8(&fixture("rsa-priv.pem")).unwrap();
        assert!(rcgen::KeyPair::from_pem(&p8).is_ok());
    }

    #[test]
    fn a_certificate_gives_its_public_key() {
        let der = |pem: &[u8]| pem::parse(pem).unwrap().into_contents();
        let theirs = der(&fixture("ec-pub.pem"));
        let ours = public_spki(&fixture("ec-cert.pem")).unwrap();
        assert_eq!(der(ours.as_bytes()), theirs);
        assert_eq!(
            der(public_spki(&fixture("ec-pub.pem")).unwrap().as_bytes()),
            theirs
        );
        let e = public_spki(&fixture("ec-priv.pem")).unwrap_err();
        assert!(e.contains("not a public key"), "{e}");
    }

    #[test]
    fn other_first_blocks_are_refused() {
        for name in ["rsa-pub.pem", "ec-pub.pem", "ec-priv-with-params.pem"] {
            let e = private_pkcs8(&fixture(name)).unwrap_err();
            assert!(e.contains("not a private key"), "{name}: {e}");
        }
        assert!(private_pkcs8(b"not a key").is_err());
        let junk = pem::encode(&pem::Pem::new("EC PRIVATE KEY", vec![1, 2, 3]));
        assert!(private_pkcs8(junk.as_bytes()).unwrap_err().contains("SEC1"));
    }
}
