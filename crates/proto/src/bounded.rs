//! Decoding of the long lists of a server message with an upper bound on their length, so
//! that a frame of minimal elements (one byte each, for `Break::All`) cannot expand into
//! tens of times its size in memory.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, DeserializeSeed, Deserializer, Error, SeqAccess, Visitor};

struct Bounded<T>(usize, PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a sequence of at most {} elements", self.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        if hint > self.0 {
            return Err(A::Error::invalid_length(hint, &self));
        }
        // Room for what the length says, within reason: the length is the peer's word.
        let mut v = Vec::with_capacity(hint.min(4096));
        while let Some(x) = seq.next_element()? {
            if v.len() == self.0 {
                return Err(A::Error::invalid_length(v.len() + 1, &self));
            }
            v.push(x);
        }
        Ok(v)
    }
}

fn vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    max: usize,
) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Bounded(max, PhantomData))
}

pub(super) fn groups<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    vec(d, crate::ids::MAX_GROUPS)
}

pub(super) fn breaks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<crate::msg::Break>, D::Error> {
    vec(d, crate::msg::MAX_BREAKS)
}

pub(super) fn dir_entries<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<crate::msg::DirEntry>, D::Error> {
    vec(d, crate::msg::MAX_DIR_PAGE_ENTRIES)
}

/// The listings of a [`crate::msg::Reply::Tree`], with [`crate::msg::MAX_TREE_ENTRIES`] bounding
/// the entries and directories of all of them together (each list bounded alone would
/// let a frame of minimal entries decode into many times its size).
pub(super) fn tree<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<crate::msg::TreeDir>, D::Error> {
    d.deserialize_seq(Tree)
}

struct Tree;

impl<'de> Visitor<'de> for Tree {
    type Value = Vec<crate::msg::TreeDir>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {} listings", crate::msg::MAX_TREE_ENTRIES)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut left = crate::msg::MAX_TREE_ENTRIES;
        let hint = seq.size_hint().unwrap_or(0);
        if hint > left {
            return Err(A::Error::invalid_length(hint, &self));
        }
        let mut v = Vec::with_capacity(hint.min(4096));
        while let Some(d) = seq.next_element_seed(Listing(&mut left))? {
            v.push(d);
        }
        Ok(v)
    }
}

/// Takes one from what is left of the bound.
fn spend<E: Error>(left: &mut usize) -> Result<(), E> {
    *left = left.checked_sub(1).ok_or_else(|| {
        E::custom(format!(
            "a tree of more than {} entries and directories",
            crate::msg::MAX_TREE_ENTRIES
        ))
    })?;
    Ok(())
}

/// One [`crate::msg::TreeDir`], its directory and entries spent from the bound.
struct Listing<'a>(&'a mut usize);

impl<'de> DeserializeSeed<'de> for Listing<'_> {
    type Value = crate::msg::TreeDir;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_struct("TreeDir", &["file_id", "entries"], self)
    }
}

impl<'de> Visitor<'de> for Listing<'_> {
    type Value = crate::msg::TreeDir;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a directory's listing")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let file_id: u64 = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &self))?;
        spend::<A::Error>(self.0)?;
        let entries = seq
            .next_element_seed(Entries(&mut *self.0))?
            .ok_or_else(|| A::Error::invalid_length(1, &"a listing's entries"))?;
        Ok(crate::msg::TreeDir { file_id, entries })
    }
}

/// The entries of one listing of a tree, spent from the bound.
struct Entries<'a>(&'a mut usize);

impl<'de> DeserializeSeed<'de> for Entries<'_> {
    type Value = Vec<crate::msg::DirEntry>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = Vec<crate::msg::DirEntry>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a listing's entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        if hint > *self.0 {
            return Err(A::Error::invalid_length(
                hint,
                &"the rest of the tree's bound",
            ));
        }
        let mut v = Vec::with_capacity(hint.min(4096));
        while let Some(e) = seq.next_element()? {
            spend::<A::Error>(self.0)?;
            v.push(e);
        }
        Ok(v)
    }
}
