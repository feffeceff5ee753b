//! etcd's own forms of the MVCC state, for what must match etcd byte for byte or element for
//! element: its storage encoding (the bbolt buckets `key` and `lease`, in [`format`]), store
//! images in that encoding for backups and restores ([`image`]), and Go's `sort.Sort`
//! ([`gosort`]) so that results whose sort keys tie come out in etcd's order.
//!
//! Invariant: these modules convert and order; they never change the store. They use the
//! MVCC layer's lower modules (`error`, `index`) and, for images, the store type.

pub mod format;
pub(super) mod gosort;
pub(super) mod image;

#[cfg(test)]
mod image_tests;
