//! Runs one job over TCP on loopback, every rank's job in a thread of this process with a
//! transport of its own (its own I/O thread and coordination thread), as separate
//! processes would have, and returns rank 0's outcome.

use superstep::transport::{TcpSettings, TcpTransport};
use superstep::{JobBuilder, JobOutcome, Payload};

pub fn run_over_tcp<M: Payload, W: Payload>(
    ranks: usize,
    job: impl Fn() -> JobBuilder<M, W> + Send + Sync + Clone + 'static,
) -> JobOutcome<M> {
    let mut s = TcpSettings::new(0, ranks, "127.0.0.1:0");
    s.bind = Some("127.0.0.1:0".parse().expect("an address"));
    let master = TcpTransport::new(s).expect("rank 0 binds");
    let addr = master.local_addr().expect("rank 0 listens").to_string();
    let others: Vec<_> = (1..ranks)
        .map(|rank| {
            let t = TcpTransport::new(TcpSettings::new(rank, ranks, addr.clone()))
                .expect("a rank's transport");
            let job = job.clone();
            std::thread::spawn(move || job().transport(t).run())
        })
        .collect();
    let outcome = job().transport(master).run().expect("the job runs");
    for o in others {
        o.join().expect("a rank's thread").expect("a rank runs");
    }
    outcome
}
