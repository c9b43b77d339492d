//! A generated undirected graph, its components computed in one thread, and its vertices
//! split among workers by id range: what the graph examples share.

// Each example uses its part.
#![allow(dead_code)]

use std::ops::Range;
use std::sync::Arc;

/// Every vertex's label: the smallest vertex id known to be in its component.
pub type Labels = Vec<u32>;

/// An undirected graph of `vertices` vertices.
pub struct Graph {
    pub vertices: u32,
    pub edges: Vec<(u32, u32)>,
}

/// A graph of `vertices` vertices and `edges` edges drawn uniformly from `seed` (a 64-bit
/// LCG): a large component of short diameter, and small ones beside it.
pub fn graph(vertices: u32, edges: usize, seed: u64) -> Arc<Graph> {
    local_graph(vertices, edges, seed, 0.0)
}

/// [`graph`], but a share `local` of the edges join a vertex to one near it: its second
/// end is drawn within `vertices / 256` ids of its first, as in a web graph ordered by
/// address, where most links stay on their site. Split by id range, those edges mostly
/// stay within one rank.
pub fn local_graph(vertices: u32, edges: usize, seed: u64, local: f64) -> Arc<Graph> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    // `local` as a share of 2^31, the range of `next`.
    let near = (local.clamp(0.0, 1.0) * f64::from(1u32 << 31)) as u32;
    let window = (vertices / 256).max(1);
    let edges = (0..edges)
        .map(|_| {
            let u = next() % vertices;
            if near > 0 && next() < near {
                let d = next() % (2 * window + 1);
                (
                    u,
                    ((u64::from(u) + u64::from(vertices) + u64::from(d) - u64::from(window))
                        % u64::from(vertices)) as u32,
                )
            } else {
                (u, next() % vertices)
            }
        })
        .collect();
    Arc::new(Graph { vertices, edges })
}

/// The components of `graph` computed in one thread (union-find): what the job must give.
pub fn components(graph: &Graph) -> Labels {
    let mut parent: Vec<u32> = (0..graph.vertices).collect();
    fn root(parent: &mut [u32], mut v: u32) -> u32 {
        while parent[v as usize] != v {
            parent[v as usize] = parent[parent[v as usize] as usize];
            v = parent[v as usize];
        }
        v
    }
    for &(u, v) in &graph.edges {
        let (a, b) = (root(&mut parent, u), root(&mut parent, v));
        // The smaller id is the root, so a component's root is its smallest vertex.
        if a < b {
            parent[b as usize] = a;
        } else if b < a {
            parent[a as usize] = b;
        }
    }
    (0..graph.vertices).map(|v| root(&mut parent, v)).collect()
}

/// The vertices of rank `rank` of `workers`: an even range of ids.
pub fn range(vertices: u32, rank: usize, workers: usize) -> Range<u32> {
    let share = |r: usize| (vertices as u64 * r as u64 / workers as u64) as u32;
    share(rank)..share(rank + 1)
}

/// The rank of `workers` whose range holds vertex `v`: the first whose range ends after
/// it, `range(r).end > v` ⇔ `vertices × (r + 1) / workers ≥ v + 1`.
pub fn owner(vertices: u32, workers: usize, v: u32) -> usize {
    let (n, v) = (workers as u64, u64::from(v));
    ((n * (v + 1)).div_ceil(u64::from(vertices)) - 1) as usize
}

/// The neighbours of the vertices of one range, packed: vertex `range.start + i`'s are
/// `targets[offsets[i]..offsets[i + 1]]`.
pub struct Adjacency {
    pub range: Range<u32>,
    pub offsets: Vec<usize>,
    pub targets: Vec<u32>,
}

impl Adjacency {
    /// The neighbours of the vertices of `range` in `graph`.
    pub fn of(graph: &Graph, range: Range<u32>) -> Self {
        let start = range.start;
        let mut offsets = vec![0usize; range.len() + 1];
        for &(u, v) in &graph.edges {
            if range.contains(&u) {
                offsets[(u - start) as usize + 1] += 1;
            }
            if range.contains(&v) {
                offsets[(v - start) as usize + 1] += 1;
            }
        }
        for i in 1..offsets.len() {
            offsets[i] += offsets[i - 1];
        }
        let mut at = offsets.clone();
        let mut targets = vec![0u32; offsets[range.len()]];
        let mut put = |from: u32, to: u32| {
            let slot = &mut at[(from - start) as usize];
            targets[*slot] = to;
            *slot += 1;
        };
        for &(u, v) in &graph.edges {
            if range.contains(&u) {
                put(u, v);
            }
            if range.contains(&v) {
                put(v, u);
            }
        }
        Adjacency {
            range,
            offsets,
            targets,
        }
    }

    /// The neighbours of the range's `i`-th vertex.
    pub fn around(&self, i: usize) -> &[u32] {
        &self.targets[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// The flags of the graph examples; all but the worker count are the job's parameters
/// (`JobBuilder::params`): a checkpoint of another graph is another job's.
#[derive(clap::Args, Debug, serde::Serialize)]
pub struct GraphArgs {
    /// Vertices of the generated graph.
    #[arg(long, default_value_t = 1_000_000)]
    pub vertices: u32,
    /// Edges of the generated graph, drawn uniformly.
    #[arg(long, default_value_t = 10_000_000)]
    pub edges: usize,
    /// Workers, in memory (default: one per core; in a cluster job, one per process).
    #[arg(long)]
    #[serde(skip)]
    pub workers: Option<usize>,
    /// Seed of the generated graph.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The share of edges that join a vertex to one within vertices/256 ids of it (so to
    /// a vertex of its own rank, mostly), as in a web graph ordered by address; the rest
    /// are drawn uniformly.
    #[arg(long, default_value_t = 0.0)]
    pub local: f64,
}

/// What a graph job's run came to in this process.
#[cfg(feature = "tcp")]
pub struct Ran<M> {
    pub graph: Arc<Graph>,
    pub outcome: superstep::JobOutcome<M>,
    pub took: std::time::Duration,
    pub workers: usize,
    /// Whether this process ran the master (and printed the supersteps).
    pub runs_master: bool,
}

/// Generates the graph `args` describe and runs the job `make` builds on it, named `name`:
/// every rank in memory, or this process's rank of the cluster the environment names
/// (`cluster_from_env`). The master's process prints each superstep's messages and bytes.
/// What went wrong is printed, and is the error.
#[cfg(feature = "tcp")]
pub fn run<M, W>(
    args: &GraphArgs,
    name: &str,
    make: impl FnOnce(Arc<Graph>) -> superstep::JobBuilder<M, W>,
) -> Result<Ran<M>, std::process::ExitCode>
where
    M: superstep::Payload,
    W: superstep::Payload,
{
    let failed = |what: String| {
        eprintln!("{what}");
        std::process::ExitCode::FAILURE
    };
    let made = std::time::Instant::now();
    let graph = local_graph(args.vertices, args.edges, args.seed, args.local);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let builder = make(Arc::clone(&graph))
        .job_id(name)
        .params(args)
        .workers(args.workers.unwrap_or(cores))
        .cluster_from_env()
        .map_err(|e| failed(e.to_string()))?;
    let (rank, runs_master, workers) = (
        builder.process_rank(),
        builder.runs_master(),
        builder.worker_count(),
    );
    println!(
        "generated {} vertices, {} edges (seed {}{}) in {:.2?}; {workers} workers",
        args.vertices,
        args.edges,
        args.seed,
        if args.local > 0.0 {
            format!(", {}% local", args.local * 100.0)
        } else {
            String::new()
        },
        made.elapsed(),
    );
    let started = std::time::Instant::now();
    let outcome = builder
        .run()
        .map_err(|e| failed(format!("job failed: {e}")))?;
    let took = started.elapsed();
    if runs_master {
        println!("superstep   messages  after combining        bytes     time");
        for it in &outcome.report.iterations {
            let m = it.messages;
            println!(
                "{:>9} {:>10} {:>16} {:>12} {:>8.1?}",
                it.iteration, m.sent, m.delivered, m.bytes, it.elapsed
            );
        }
    } else {
        println!("rank {}: done in {took:.2?}", rank.unwrap_or(0));
    }
    Ok(Ran {
        graph,
        outcome,
        took,
        workers,
        runs_master,
    })
}

/// Every edge of `graph` both ways, as a vertex program's job takes them
/// (`GraphBuilder::edges`).
pub fn undirected(
    graph: &Arc<Graph>,
) -> impl Fn(&mut dyn FnMut(u32, u32, ())) + Send + Sync + 'static {
    let graph = Arc::clone(graph);
    move |add| {
        for &(u, v) in &graph.edges {
            add(u, v, ());
            add(v, u, ());
        }
    }
}

/// Log lines on standard error (the results go on standard output), at `info` for the
/// library unless `RUST_LOG` says otherwise.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,superstep=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
