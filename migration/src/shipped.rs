//! Shipped migrations are never edited or renamed.
//!
//! A database records each migration by name and never applies it again,
//! so an edit to a shipped migration reaches only fresh databases (the
//! schemas of existing ones silently differ), and a rename applies it a
//! second time. A change to the schema is always a new migration,
//! compatible with the release before it (docs/operations.md, "Upgrades
//! and rollbacks"). `shipped.txt` lists each platform migration's SHA-256
//! and name, in order; a new migration is added to it in the change that
//! adds it. The shapes and helpers the shipped migrations share
//! (`columns.rs`) are listed too: editing them edits every migration that
//! uses them, so a new shape goes in a module of its own. The domain's
//! migrations (`src/domain/`) are a fork's own.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{Migrator, MigratorTrait};

/// `(hash, name)` per line of `shipped.txt`.
fn shipped() -> Vec<(String, String)> {
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("shipped.txt"))
        .expect("migration/shipped.txt lists the shipped migrations");
    list.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (hash, name) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("shipped.txt: `{line}` is not `<sha256> <name>`"));
            (hash.to_owned(), name.to_owned())
        })
        .collect()
}

/// The platform's migrations, in order: the domain's are a fork's.
fn platform() -> Vec<String> {
    let domain: Vec<String> = crate::domain::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .filter(|name| !domain.contains(name))
        .collect()
}

#[test]
fn shipped_migrations_are_never_edited_or_renamed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (hash, name) in shipped() {
        let text = std::fs::read(src.join(format!("{name}.rs"))).unwrap_or_else(|_| {
            panic!("{name} has shipped and its file is gone: a shipped migration (or a shape it uses) is never renamed or removed")
        });
        let actual = format!("{:x}", Sha256::digest(&text));
        assert_eq!(
            actual, hash,
            "{name} has shipped and has been edited: write a new migration instead (docs/operations.md, upgrades and rollbacks)"
        );
    }
}

/// Files `shipped.txt` lists that are no migration.
const SHARED: &[&str] = &["columns"];

#[test]
fn every_platform_migration_is_listed_in_order() {
    let listed: Vec<String> = shipped()
        .into_iter()
        .map(|(_, name)| name)
        .filter(|name| !SHARED.contains(&name.as_str()))
        .collect();
    assert_eq!(
        platform(),
        listed,
        "migration/shipped.txt lists every platform migration, in the Migrator's order; add a new one's hash and name when adding it (`sha256sum migration/src/<name>.rs`)"
    );
}
