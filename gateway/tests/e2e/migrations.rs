//! The migrations on a cluster of their own: the database roles they create are shared by every
//! database of the cluster, so several databases migrating at once (as tests do, and as several
//! gateways on one server would) must all succeed; and a user that is not a superuser, only
//! allowed to create roles, can migrate and then run as `sandgate_app`.

use std::os::unix::fs::PermissionsExt;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use gateway::database::{self, EmbeddedPostgres};

/// Stops the private cluster however the test ends.
struct Cluster(EmbeddedPostgres);

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.0.stop_now("immediate") {
            eprintln!("stopping the test cluster: {err}");
        }
    }
}

async fn superuser(pg: &EmbeddedPostgres) -> PgConnection {
    PgConnection::connect_with(&pg.connect_options("postgres"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_cluster_migrates_many_databases_at_once_and_without_a_superuser() {
    let dir = tempfile::tempdir().unwrap();
    // The cluster runs as `postgres` when the tests run as root: it must enter the directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().to_owned();
    let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&path, None))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("cannot start PostgreSQL: {err}"));
    let cluster = Cluster(pg);
    let pg = &cluster.0;

    // Four databases, none of the roles yet: every migration races to create them.
    let names: Vec<String> = (0..4).map(|n| format!("db{n}")).collect();
    for name in &names {
        database::create_database_if_missing(pg, name)
            .await
            .unwrap();
    }
    let migrations = names.iter().map(|name| {
        let options = pg.connect_options(name);
        async move { database::migrate_as_owner(&options).await }
    });
    for result in futures_util::future::join_all(migrations).await {
        result.unwrap();
    }
    for name in &names {
        let app = database::pool(pg.connect_options(name)).await.unwrap();
        let user: String = sqlx::query_scalar("SELECT current_user::text")
            .fetch_one(&app)
            .await
            .unwrap();
        assert_eq!(user, "sandgate_app", "{name}");
        app.close().await;
    }

    // An owner that may create roles but is not a superuser (a managed PostgreSQL's admin user).
    let mut conn = superuser(pg).await;
    for statement in [
        "CREATE ROLE owner_user LOGIN CREATEROLE",
        "CREATE DATABASE owned OWNER owner_user",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    let owner: PgConnectOptions = pg.connect_options("owned").username("owner_user");
    database::migrate_as_owner(&owner).await.unwrap();
    let app = database::pool(owner).await.unwrap();
    let store = gateway::audit::AuditStore::new(app.clone());
    store.create_key("agent", "acme").await.unwrap();
    let refused = sqlx::query("DELETE FROM audit_events").execute(&app).await;
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("permission denied"),
        "the owner's pool acts as sandgate_app"
    );
    app.close().await;
}

/// A clone under a private directory (`/root`, a `mktemp -d` folder; mode 0700): the cluster's
/// `postgres` user cannot enter it, so (as root) the cluster lives under
/// `/var/lib/sandgate/pg/<hash>` and starts, serves and stops all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_starts_for_a_data_dir_under_a_private_0700_directory() {
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data_dir = private.path().join("clone/.sandgate");
    let path = data_dir.clone();
    let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&path, None))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("cannot start PostgreSQL under a 0700 parent: {err}"));
    let cluster = Cluster(pg);
    let pg = &cluster.0;
    let root = pg.pgdata().parent().unwrap().to_owned();
    if nix::unistd::Uid::effective().is_root() {
        assert!(
            root.starts_with(database::embedded::RELOCATED_ROOT),
            "as root the cluster moves where postgres can reach it, not {}",
            root.display()
        );
        let note = std::fs::read_to_string(root.join("data_dir")).unwrap();
        assert_eq!(note.trim(), data_dir.display().to_string());
    } else {
        assert_eq!(root, data_dir.join("pg"));
    }
    let mut conn = superuser(pg).await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    conn.close().await.unwrap();
    drop(cluster);
    if root.starts_with(database::embedded::RELOCATED_ROOT) {
        std::fs::remove_dir_all(&root).unwrap();
    }
}
