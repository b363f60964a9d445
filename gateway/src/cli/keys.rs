//! `sandgate keys create|list|revoke|rotate`: API keys in the configured database. The
//! functions behind them are public, so tests create and rotate keys the way operators do.

use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Subcommand;

use crate::app::keys::{check_new_key, CheckedKey};
use crate::app::replay;
use crate::audit::keys::{KeyRow, Revoked};
use crate::audit::{AuditStore, NewKey};
use crate::config::Config;
use crate::database::Database;
use crate::role::Role;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a key; it is printed once, as the last line of stdout.
    Create {
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[arg(long)]
        tenant: String,
        /// The person or system behind the key (default: the key's own id). A reviewer key
        /// cannot approve requests made by a key of the same principal.
        #[arg(long)]
        principal: Option<String>,
        /// The key stops working this long from now (30d, 12h, 90m); default: never.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List keys (never their secrets or hashes): id, role, tenant, principal, state, expiry,
    /// last use.
    List {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key: it is refused from the next request on.
    Revoke { id: String },
    /// Replace a live key by a new one of the same role, tenant and principal, and revoke the
    /// old one; the new key is printed once, as the last line of stdout.
    Rotate {
        id: String,
        /// The new key stops working this long from now; default: never.
        #[arg(long)]
        expires_in: Option<String>,
    },
}

pub async fn run(command: KeysCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::Create {
            role,
            tenant,
            principal,
            expires_in,
        } => {
            create(
                role,
                &tenant,
                principal.as_deref(),
                expires_in.as_deref(),
                config,
            )
            .await?
        }
        KeysCommand::List { tenant } => list(tenant.as_deref(), config).await?,
        KeysCommand::Revoke { id } => match revoke_key(config, &id).await? {
            Revoked::Now(_) => println!("revoked {id}"),
            Revoked::Already(_) => println!("{id} was already revoked"),
            Revoked::Unknown => anyhow::bail!("no key {id}"),
        },
        KeysCommand::Rotate { id, expires_in } => {
            let key = rotate_key(config, &id, expires_in.as_deref()).await?;
            println!(
                "revoked {id}; created key {} for principal {}",
                key.id, key.principal
            );
            println!("{}", key.secret);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--role`: one of the API's closed set of roles (api-types), spelt as keys store it.
fn parse_role(text: &str) -> Result<Role, String> {
    Role::parse(text).ok_or_else(|| {
        let names: Vec<&str> = Role::ALL.iter().map(|role| role.as_str()).collect();
        format!("one of: {}", names.join(", "))
    })
}

async fn create(
    role: Role,
    tenant: &str,
    principal: Option<&str>,
    expires_in: Option<&str>,
    config: &Config,
) -> anyhow::Result<()> {
    let expires_at = expires_in.map(expiry_from_now).transpose()?;
    let checked =
        check_new_key(role.as_str(), tenant, principal, expires_at).map_err(anyhow::Error::msg)?;
    if let Some(warning) = tenant_warning(config, tenant) {
        eprintln!("warning: {warning}");
    }
    let key = create_checked_key(config, &checked).await?;
    let expiry = expires_at.map_or("never".to_owned(), |at| at.to_rfc3339());
    println!(
        "created {} key {} for tenant {tenant}, principal {}, expires {expiry}",
        role.as_str(),
        key.id,
        key.principal
    );
    println!("{}", key.secret);
    Ok(())
}

async fn list(tenant: Option<&str>, config: &Config) -> anyhow::Result<()> {
    let now = Utc::now();
    let when = |at: Option<DateTime<Utc>>| at.map_or("-".to_owned(), |at| at.to_rfc3339());
    println!("ID\tROLE\tTENANT\tPRINCIPAL\tSTATE\tCREATED\tEXPIRES\tLAST_USED");
    for key in list_keys(config, tenant).await? {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            key.id,
            key.role,
            key.tenant,
            key.principal,
            key.state(now),
            key.created_at.to_rfc3339(),
            when(key.expires_at),
            when(key.last_used_at)
        );
    }
    Ok(())
}

/// `sandgate keys create`: a new key in the configured database.
pub async fn create_key(config: &Config, role: &str, tenant: &str) -> anyhow::Result<NewKey> {
    create_key_for(config, role, tenant, None).await
}

/// `sandgate keys create --principal NAME`: a new key of a named principal (default: the key's
/// own id). Keys of one principal are one party for self-approval.
pub async fn create_key_for(
    config: &Config,
    role: &str,
    tenant: &str,
    principal: Option<&str>,
) -> anyhow::Result<NewKey> {
    let checked = check_new_key(role, tenant, principal, None).map_err(anyhow::Error::msg)?;
    create_checked_key(config, &checked).await
}

/// `sandgate keys create [--principal NAME] [--expires-in D]`: stores a checked key.
pub async fn create_checked_key(config: &Config, checked: &CheckedKey) -> anyhow::Result<NewKey> {
    let db = Database::open(config).await?;
    let key = AuditStore::new(db.pool.clone())
        .create_key_by(&checked.spec(), None)
        .await;
    db.close().await;
    key.context("storing the key")
}

/// What to warn about a new key's tenant: absent from the configured policy bundle's data, or
/// the bundle cannot be read to tell. `None`: the policy knows the tenant.
pub fn tenant_warning(config: &Config, tenant: &str) -> Option<String> {
    match policy_engine::PolicyEngine::load(&config.policy_dir) {
        Ok(engine) if engine.tenants().iter().any(|t| t == tenant) => None,
        Ok(_) => Some(crate::app::keys::unknown_tenant_warning(tenant)),
        Err(err) => Some(format!(
            "could not check tenant {tenant} against the policy in {}: {err}",
            config.policy_dir.display()
        )),
    }
}

/// `sandgate keys list [--tenant T]`: every key (never a hash), newest first.
pub async fn list_keys(config: &Config, tenant: Option<&str>) -> anyhow::Result<Vec<KeyRow>> {
    let db = Database::open(config).await?;
    let store = AuditStore::new(db.pool.clone());
    let mut keys = Vec::new();
    let mut before: Option<String> = None;
    let listed = loop {
        let page = match store.list_keys(tenant, before.as_deref(), 500).await {
            Ok(page) => page,
            Err(err) => break Err(err),
        };
        let full = page.len() == 500;
        before = page.last().map(|row| row.id.clone());
        keys.extend(page);
        if !full {
            break Ok(keys);
        }
    };
    db.close().await;
    listed.context("listing keys")
}

/// `sandgate keys revoke ID`.
pub async fn revoke_key(config: &Config, id: &str) -> anyhow::Result<Revoked> {
    let db = Database::open(config).await?;
    let revoked = AuditStore::new(db.pool.clone()).revoke_key(id, None).await;
    db.close().await;
    revoked.context("revoking the key")
}

/// `sandgate keys rotate ID [--expires-in D]`: a new key of the same role, tenant and principal;
/// the old one is revoked in the same transaction. Fails when no live key has that id.
pub async fn rotate_key(
    config: &Config,
    id: &str,
    expires_in: Option<&str>,
) -> anyhow::Result<NewKey> {
    let expires_at = expires_in.map(expiry_from_now).transpose()?;
    let db = Database::open(config).await?;
    let rotated = AuditStore::new(db.pool.clone())
        .rotate_key(id, expires_at)
        .await;
    db.close().await;
    rotated
        .context("rotating the key")?
        .with_context(|| format!("no live key {id} (unknown, revoked or expired)"))
}

/// `--expires-in 30d`: that long from now.
pub fn expiry_from_now(text: &str) -> anyhow::Result<DateTime<Utc>> {
    let span = replay::parse_duration(text).map_err(anyhow::Error::msg)?;
    let span = chrono::Duration::from_std(span).context("--expires-in is too long")?;
    Utc::now()
        .checked_add_signed(span)
        .context("--expires-in is too long")
}
