//! The standard `process_*` metrics of this process (as Prometheus client libraries name
//! them), read from procfs on each scrape.

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Collects `process_*` metrics of the current process at scrape time.
#[derive(Debug)]
pub struct ProcessCollector;

/// One scrape's figures; `None` where procfs could not tell.
#[derive(Debug, Default)]
struct Sample {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    start_time_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
}

fn sample() -> Sample {
    let Ok(me) = Process::myself() else { return Sample::default() };
    let mut sample = Sample::default();
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        sample.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
        sample.resident_bytes = Some((stat.rss * procfs::page_size()) as f64);
        sample.virtual_bytes = Some(stat.vsize as f64);
        sample.start_time_seconds =
            procfs::boot_time_secs().ok().map(|boot| boot as f64 + stat.starttime as f64 / ticks);
    }
    sample.open_fds = me.fd_count().ok().map(|n| n as f64);
    sample.max_fds = me.limits().ok().and_then(|l| match l.max_open_files.soft_limit {
        LimitValue::Value(n) => Some(n as f64),
        LimitValue::Unlimited => None,
    });
    sample
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: Option<f64>) -> Result<(), std::fmt::Error> {
    let Some(value) = value else { return Ok(()) };
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample();
        if let Some(cpu) = s.cpu_seconds {
            let metric = ConstCounter::new(cpu);
            metric.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                metric.metric_type(),
            )?)?;
        }
        gauge(&mut encoder, "process_resident_memory_bytes", "Resident memory size in bytes", s.resident_bytes)?;
        gauge(&mut encoder, "process_virtual_memory_bytes", "Virtual memory size in bytes", s.virtual_bytes)?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            s.start_time_seconds,
        )?;
        gauge(&mut encoder, "process_open_fds", "Number of open file descriptors", s.open_fds)?;
        gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors", s.max_fds)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_described() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let text = crate::metrics::render(&registry);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
        ] {
            let value = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok());
            assert!(value.is_some(), "{name} missing from {text}");
        }
        let open: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .and_then(|v| v.parse().ok())
            .expect("open fds");
        assert!(open >= 1.0, "a test process has its standard streams open: {open}");
    }
}
