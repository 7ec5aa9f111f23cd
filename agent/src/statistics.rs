//! EBS detailed performance statistics: the vendor-specific NVMe log page
//! 0xD0 every EBS volume keeps ("Amazon EBS detailed performance
//! statistics", Amazon EBS User Guide).
//!
//! Layout (little endian) from `struct amzn_latency_log_page` in nvme-cli's
//! amzn plugin (plugins/amzn/amzn-nvme.c), which the Go driver's parser
//! follows too: magic `0x3C23B510` (u32) and a version (u32); eleven u64
//! counters from byte 8 (operations, bytes, times in microseconds, queue
//! length); 416 reserved bytes; from byte 512 the read latency histogram
//! and from byte 2056 the write one, each a bin count (u64) and 64 bins of
//! lower and upper bound (u64, microseconds) and count (u32, then 4
//! reserved bytes).

/// The page's magic number (`AMZN_NVME_STATS_MAGIC`).
pub const MAGIC: u32 = 0x3C23_B510;

/// Offset of the read latency histogram.
const READ_HISTOGRAM: usize = 512;
/// Bins a histogram has room for.
const MAX_BINS: usize = 64;
/// Bytes of one bin.
const BIN_LEN: usize = 24;
/// Bytes of one histogram: the bin count, then the bins.
const HISTOGRAM_LEN: usize = 8 + MAX_BINS * BIN_LEN;
/// Offset of the write latency histogram.
const WRITE_HISTOGRAM: usize = READ_HISTOGRAM + HISTOGRAM_LEN;
/// Bytes the parser reads.
const PARSED_LEN: usize = WRITE_HISTOGRAM + HISTOGRAM_LEN;

/// The statistics of one volume since it was attached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Completed read operations.
    pub read_ops: u64,
    /// Completed write operations.
    pub write_ops: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Time spent by completed reads, in microseconds.
    pub read_time_us: u64,
    /// Time spent by completed writes, in microseconds.
    pub write_time_us: u64,
    /// Time IOPS demand exceeded the volume's provisioned IOPS, in
    /// microseconds.
    pub ebs_iops_exceeded_us: u64,
    /// Time throughput demand exceeded the volume's provisioned
    /// throughput, in microseconds.
    pub ebs_throughput_exceeded_us: u64,
    /// Time the volume exceeded the instance's maximum EBS IOPS, in
    /// microseconds.
    pub ec2_iops_exceeded_us: u64,
    /// Time the volume exceeded the instance's maximum EBS throughput, in
    /// microseconds.
    pub ec2_throughput_exceeded_us: u64,
    /// Reads and writes waiting to complete.
    pub queue_length: u64,
    /// Read latency histogram, in the page's order.
    pub read_latency: Vec<Bin>,
    /// Write latency histogram, in the page's order.
    pub write_latency: Vec<Bin>,
}

/// One latency histogram bin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bin {
    /// Lower bound, in microseconds.
    pub lower_us: u64,
    /// Upper bound, in microseconds.
    pub upper_us: u64,
    /// Operations completed within the bounds.
    pub count: u64,
}

/// Why a page is not EBS statistics.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than the layout needs.
    #[error("the log page has {0} bytes, fewer than {PARSED_LEN}")]
    Short(usize),
    /// Another magic number: not EBS's page.
    #[error("the log page's magic is {0:#x}, not {MAGIC:#x}")]
    Magic(u32),
    /// A histogram claims more bins than it has room for.
    #[error("a latency histogram claims {0} bins, more than {MAX_BINS}")]
    Bins(u64),
}

/// Parses a log page read from an EBS volume.
///
/// # Errors
/// [`ParseError`]: too short, another magic, or an impossible bin count.
pub fn parse(page: &[u8]) -> Result<Statistics, ParseError> {
    let page = page.get(..PARSED_LEN).ok_or(ParseError::Short(page.len()))?;
    let magic = u32::from_le_bytes(array(page, 0));
    if magic != MAGIC {
        return Err(ParseError::Magic(magic));
    }
    let counter = |index: usize| u64_at(page, 8 + 8 * index);
    Ok(Statistics {
        read_ops: counter(0),
        write_ops: counter(1),
        read_bytes: counter(2),
        write_bytes: counter(3),
        read_time_us: counter(4),
        write_time_us: counter(5),
        ebs_iops_exceeded_us: counter(6),
        ebs_throughput_exceeded_us: counter(7),
        ec2_iops_exceeded_us: counter(8),
        ec2_throughput_exceeded_us: counter(9),
        queue_length: counter(10),
        read_latency: histogram(page, READ_HISTOGRAM)?,
        write_latency: histogram(page, WRITE_HISTOGRAM)?,
    })
}

fn histogram(page: &[u8], offset: usize) -> Result<Vec<Bin>, ParseError> {
    let count = u64_at(page, offset);
    let bins = usize::try_from(count)
        .ok()
        .filter(|&n| n <= MAX_BINS)
        .ok_or(ParseError::Bins(count))?;
    Ok((0..bins)
        .map(|i| {
            let bin = offset + 8 + i * BIN_LEN;
            Bin {
                lower_us: u64_at(page, bin),
                upper_us: u64_at(page, bin + 8),
                count: u64::from(u32::from_le_bytes(array(page, bin + 16))),
            }
        })
        .collect())
}

fn u64_at(page: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(array(page, offset))
}

/// `N` bytes of `page` from `offset`; every caller's range lies within
/// [`PARSED_LEN`], which [`parse`] checked first.
fn array<const N: usize>(page: &[u8], offset: usize) -> [u8; N] {
    let mut bytes = [0; N];
    bytes.copy_from_slice(&page[offset..offset + N]);
    bytes
}

#[cfg(test)]
#[path = "statistics_tests.rs"]
pub(crate) mod tests;
