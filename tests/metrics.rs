//! The job's metrics reach a real exporter: a Prometheus endpoint on 127.0.0.1, scraped.

#[path = "../examples/support/metrics.rs"]
mod served;

mod common;

use std::net::{SocketAddr, TcpListener};

use superstep::prelude::*;

#[test]
fn a_prometheus_scrape_shows_the_job_s_metrics() {
    // A free port on loopback, for the exporter to listen on.
    let addr: SocketAddr = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    served::serve(addr).unwrap();
    let outcome = served::job("scraped", 3, 5).run().unwrap();
    assert_eq!(*outcome.result, 15);
    let page = served::scrape(addr).unwrap();
    let line = |prefix: &str| {
        page.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {page}"))
            .to_string()
    };
    assert_eq!(
        line("superstep_iterations_total{"),
        r#"superstep_iterations_total{job="scraped"} 5"#
    );
    assert_eq!(
        line("superstep_results_held{"),
        r#"superstep_results_held{job="scraped"} 3"#
    );
    assert_eq!(
        line("superstep_slowest_rank{"),
        r#"superstep_slowest_rank{job="scraped"} 1"#
    );
    assert_eq!(
        line("superstep_iteration_seconds_count{"),
        r#"superstep_iteration_seconds_count{job="scraped"} 5"#
    );
    assert!(line("superstep_master_seconds_count{").ends_with(" 5"));
    assert!(line("superstep_slowest_worker_seconds_sum{").contains("job=\"scraped\""));
    assert!(
        page.contains("# HELP superstep_iteration_seconds"),
        "{page}"
    );
    // Nothing dropped in a fault-free run; every reason is there, at zero.
    for reason in ["stale", "duplicate", "unknown_rank"] {
        let dropped =
            format!(r#"superstep_messages_dropped_total{{job="scraped",reason="{reason}"}} 0"#);
        assert!(page.contains(&dropped), "{page}");
    }

    // Over TCP, every frame's bytes count: both ranks run in this process, so what one
    // sends the other receives.
    let before = bytes(&page);
    let outcomes = common::over_tcp::<u64, u64, _>(2, "scraped-tcp", |_, transport| {
        served::job("scraped-tcp", 2, 3).transport(transport).run()
    });
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let (sent, received) = bytes(&served::scrape(addr).unwrap());
    assert!(
        sent > before.0 + 100 && received > before.1 + 100,
        "{sent} {received}"
    );

    // Messages between supersteps: each rank sends the other one and itself one a
    // superstep; with the wire check, those to the other rank cross encoded.
    common::barrier_job(2, 3, |rank| common::FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            ctx.send(1 - rank, rank as u64)?;
            ctx.send(rank, 9u64)?;
            Ok(0u64)
        }) as common::WorkerFn,
    })
    .job_id("scraped-messages")
    .messages::<u64>()
    .transport(superstep::transport::MemoryTransport::new().wire_check(true))
    .run()
    .unwrap();
    let page = served::scrape(addr).unwrap();
    let sent = r#"superstep_worker_messages_total{job="scraped-messages",stage="sent"} 12"#;
    assert!(page.contains(sent), "{page}");
    let encoded = page
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"superstep_worker_message_bytes_total{job="scraped-messages"} "#)
        })
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(encoded.is_some_and(|n| n > 0), "{page}");
    let rounds = r#"superstep_worker_message_rounds{job="scraped-messages"} 1"#;
    assert!(page.contains(rounds), "{page}");
}

/// The bytes a scrape says this process sent and received over TCP.
fn bytes(page: &str) -> (u64, u64) {
    let count = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        count("superstep_bytes_sent_total "),
        count("superstep_bytes_received_total "),
    )
}
