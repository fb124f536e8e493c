//! The throwaway PostgreSQL server: it starts, serves the fencing statement the project's
//! fenced-resource tests rely on, survives a stop and restart with its data, and goes
//! away with its handle.

use leasehold_harness::{Postgres, process_exists};
use tokio_postgres::{Client, NoTls};

/// The fenced table and the one statement that writes it: a write is applied only if its
/// token is at least the highest token seen.
const CREATE_FENCED: &str = "CREATE TABLE fenced (id text PRIMARY KEY, value bigint NOT NULL, token bigint NOT NULL)";
const FENCED_WRITE: &str = "UPDATE fenced SET value = $2, token = $3 WHERE id = $1 AND token <= $3";

/// A client on `postgres`, its connection driven by the test's runtime.
async fn connect(postgres: &Postgres) -> Client {
    let (client, connection) = tokio_postgres::connect(&postgres.url(), NoTls)
        .await
        .expect("connecting to the test PostgreSQL should succeed");
    // Ends with an error when the server goes away; the client's calls report that.
    tokio::spawn(connection);
    client
}

async fn stored(client: &Client, id: &str) -> (i64, i64) {
    let row = client
        .query_one("SELECT value, token FROM fenced WHERE id = $1", &[&id])
        .await
        .expect("reading the fenced row should succeed");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn fencing_statement_applies_only_writes_with_the_highest_token() {
    let postgres = Postgres::start().expect("PostgreSQL should start");
    assert_eq!(postgres.url(), format!("postgres://postgres@127.0.0.1:{}/postgres", postgres.port()));
    let client = connect(&postgres).await;
    client.batch_execute(CREATE_FENCED).await.expect("creating the fenced table should succeed");
    client
        .execute("INSERT INTO fenced (id, value, token) VALUES ($1, 0, 0)", &[&"resource"])
        .await
        .expect("inserting the fenced row should succeed");

    // (value, token, rows updated, stored afterwards as (value, token))
    let writes: [(i64, i64, u64, (i64, i64)); 4] = [
        (10, 5, 1, (10, 5)), // a newer token: applied
        (20, 3, 0, (10, 5)), // a stale token: rejected, nothing changes
        (30, 5, 1, (30, 5)), // the same holder writing again: applied
        (40, 4, 0, (30, 5)), // stale by one: rejected
    ];
    for (value, token, expected_rows, expected_state) in writes {
        let rows = client
            .execute(FENCED_WRITE, &[&"resource", &value, &token])
            .await
            .expect("the fenced write should execute");
        assert_eq!(rows, expected_rows, "write of {value} with token {token}");
        assert_eq!(stored(&client, "resource").await, expected_state, "after the write of {value} with token {token}");
    }
}

#[tokio::test]
async fn stop_and_start_again_keep_the_port_and_the_data() {
    let postgres = Postgres::start().expect("PostgreSQL should start");
    let client = connect(&postgres).await;
    client.batch_execute(CREATE_FENCED).await.expect("creating the fenced table should succeed");
    client
        .execute("INSERT INTO fenced (id, value, token) VALUES ($1, 7, 1)", &[&"resource"])
        .await
        .expect("inserting the fenced row should succeed");

    postgres.stop();
    assert_eq!(postgres.pid(), None, "the server should be stopped");
    assert!(client.simple_query("SELECT 1").await.is_err(), "an open connection should fail once the server stops");
    assert!(
        tokio_postgres::connect(&postgres.url(), NoTls).await.is_err(),
        "a new connection should be refused while the server is stopped"
    );

    postgres.start_again().expect("PostgreSQL should start again");
    let client = connect(&postgres).await;
    assert_eq!(stored(&client, "resource").await, (7, 1), "committed data should survive the restart");
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server_and_removes_its_files() {
    let postgres = Postgres::start().expect("PostgreSQL should start");
    let pid = postgres.pid().expect("a started server has a pid");
    let dir = postgres.log().parent().expect("the log is inside the server's directory").to_owned();
    drop(postgres);
    assert!(!process_exists(pid), "the postmaster {pid} should be gone");
    assert!(!dir.exists(), "{} should be removed", dir.display());
}
