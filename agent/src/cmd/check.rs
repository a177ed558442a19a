//! `scorch check`: a preflight report, one line per requirement, with a fix for each failure.

use std::fmt;

use crate::{
    pipeline::sampler::{Sampler, SamplerConfig},
    sys::privileges::{
        Capabilities, CAP_CHECKPOINT_RESTORE, CAP_DAC_READ_SEARCH, CAP_SYSLOG, CAP_SYS_PTRACE,
        SETCAP_HINT,
    },
};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Profiling works, but something will be missing from the profiles.
    Warn,
    /// Profiling cannot work.
    Fail,
}

#[derive(Debug, Clone)]
pub struct Item {
    pub status: Status,
    pub name: &'static str,
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Ok => "OK  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        write!(f, "{status} {:<22} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, " -> {fix}")?;
        }
        Ok(())
    }
}

fn item(status: Status, name: &'static str, detail: impl Into<String>, fix: Option<&str>) -> Item {
    Item {
        status,
        name,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
    }
}

/// Runs every check. Loading and attaching the real sampler is the last, decisive one.
pub fn run_checks() -> Vec<Item> {
    let mut items = Vec::new();

    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let version = parse_kernel_version(&release);
    items.push(match version {
        Some(v) if v >= (5, 8) => item(Status::Ok, "kernel version", &release, None),
        Some(v) if v >= (4, 9) => item(
            Status::Warn,
            "kernel version",
            format!("{release}: CAP_BPF/CAP_PERFMON need 5.8, so only root can profile"),
            Some("run as root, or upgrade the kernel"),
        ),
        _ => item(
            Status::Fail,
            "kernel version",
            format!("{release:?}: perf_event BPF programs need Linux 4.9 or newer"),
            Some("upgrade the kernel"),
        ),
    });

    items.push(
        if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            item(Status::Ok, "BTF", "/sys/kernel/btf/vmlinux present", None)
        } else {
            item(
            Status::Warn,
            "BTF",
            "/sys/kernel/btf/vmlinux missing",
            Some("use a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distributions since 2020)"),
        )
        },
    );

    let caps = Capabilities::effective();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    items.push(if caps.can_profile() {
        item(
            Status::Ok,
            "privileges",
            if euid == 0 {
                "root".to_owned()
            } else {
                format!("uid {euid} with CAP_BPF and CAP_PERFMON")
            },
            None,
        )
    } else {
        item(
            Status::Fail,
            "privileges",
            format!(
                "uid {euid}, missing {}",
                caps.missing_for_profiling().join(" and ")
            ),
            Some(format!("run with sudo, or: {SETCAP_HINT}").as_str()),
        )
    });

    let paranoid = read_sysctl("/proc/sys/kernel/perf_event_paranoid");
    items.push(match paranoid {
        Some(p) if caps.can_profile() => item(
            Status::Ok,
            "perf_event_paranoid",
            format!("{p} (does not apply with CAP_PERFMON)"),
            None,
        ),
        Some(p) if p <= -1 => item(Status::Ok, "perf_event_paranoid", p.to_string(), None),
        Some(p) => item(
            Status::Fail,
            "perf_event_paranoid",
            format!("{p}: system-wide perf events need CAP_PERFMON or paranoid -1"),
            Some("grant CAP_PERFMON (preferred) or: sudo sysctl kernel.perf_event_paranoid=-1"),
        ),
        None => item(Status::Warn, "perf_event_paranoid", "unreadable", None),
    });

    let kptr = read_sysctl("/proc/sys/kernel/kptr_restrict");
    let kallsyms_visible = kallsyms_addresses_visible();
    items.push(match (kptr, kallsyms_visible) {
        (_, true) => item(
            Status::Ok,
            "kptr_restrict",
            format!("{}: kernel addresses visible", kptr.unwrap_or(-1)),
            None,
        ),
        (k, false) => item(
            Status::Warn,
            "kptr_restrict",
            format!(
                "{}: /proc/kallsyms hides addresses, kernel frames will be unnamed",
                k.map_or("unreadable".to_owned(), |k| k.to_string())
            ),
            // With kptr_restrict=0 the kernel still hides addresses from processes without
            // CAP_SYSLOG while perf_event_paranoid >= 2.
            Some(match (caps.has(CAP_SYSLOG) || euid == 0, k) {
                (true, _) => "sudo sysctl kernel.kptr_restrict=0",
                (false, Some(0)) => {
                    "grant CAP_SYSLOG, or: sudo sysctl kernel.perf_event_paranoid=1"
                }
                (false, _) => "grant CAP_SYSLOG, or: sudo sysctl kernel.kptr_restrict=0",
            }),
        ),
    });

    items.push(other_processes(caps));
    items.push(replaced_binaries(caps));

    // Decisive: load the real program and attach it on every CPU, then detach.
    let loads = || {
        item(
            Status::Ok,
            "BPF program loads",
            "scorch sampler verified",
            None,
        )
    };
    match Sampler::start(&SamplerConfig::default()) {
        Ok((sampler, _, _)) => {
            items.push(loads());
            items.push(item(
                Status::Ok,
                "perf event opens",
                format!("CPU clock attached on {} CPUs", sampler.cpus().len()),
                None,
            ));
            items.push(footprint(sampler.cpus().len()));
            #[cfg(target_arch = "aarch64")]
            items.push(pointer_authentication());
            items.push(match sampler.unwind_refused() {
                None => {
                    let walked = match sampler.verified_instructions() {
                        Some(n) => format!(
                            "user stacks walked with .eh_frame tables (--unwind auto); the \
                             verifier walked {n} instructions of its 1,000,000"
                        ),
                        None => "user stacks walked with .eh_frame tables (--unwind auto)".into(),
                    };
                    match sampler.mapping_hook_refused() {
                        None => item(
                            Status::Ok,
                            "BPF unwinder",
                            format!(
                                "{walked}; a library loaded where an unloaded one was is \
                                 noticed (vm_unmapped_area)"
                            ),
                            None,
                        ),
                        Some(reason) => item(
                            Status::Warn,
                            "BPF unwinder",
                            format!(
                                "{walked}; but the vm_unmapped_area tracepoint cannot be \
                                 attached ({reason}): a library loaded where an unloaded one \
                                 was keeps the old one's table until its process is read again"
                            ),
                            Some("a kernel with the vm_unmapped_area tracepoint"),
                        ),
                    }
                }
                Some(reason) => item(
                    Status::Warn,
                    "BPF unwinder",
                    format!(
                        "this kernel's verifier refuses it ({reason}): user stacks are walked \
                         with frame pointers only"
                    ),
                    Some("a kernel with bpf_loop (5.17+), or binaries built with frame pointers"),
                ),
            });
        }
        Err(err) => {
            let attach = matches!(err, crate::pipeline::sampler::SamplerError::Attach { .. });
            if attach {
                items.push(loads());
            }
            items.push(item(
                Status::Fail,
                if attach {
                    "perf event opens"
                } else {
                    "BPF program loads"
                },
                err.to_string(),
                Some("fix the failures above first; see `dmesg` for the kernel's reason"),
            ));
            return items;
        }
    }
    // After the sampler above is dropped: the two are never loaded at once.
    items.push(off_cpu_hook());
    items
}

/// `record --off-cpu`: the `sched_switch` program loads and attaches (with the sampler, as
/// the command loads it). A kernel where it does not still profiles the CPU.
fn off_cpu_hook() -> Item {
    let config = SamplerConfig {
        off_cpu: Some(crate::pipeline::off_cpu::OffCpuSettings::default()),
        ..SamplerConfig::default()
    };
    match Sampler::start(&config) {
        Ok((sampler, _, _)) => {
            let verified = sampler
                .off_cpu_verified_instructions()
                .map(|n| format!("; the verifier walked {n} instructions of its 1,000,000"))
                .unwrap_or_default();
            item(
                Status::Ok,
                "off-CPU hook",
                format!("sched_switch raw tracepoint attached (record --off-cpu){verified}"),
                None,
            )
        }
        Err(err) => item(
            Status::Warn,
            "off-CPU hook",
            format!("record --off-cpu cannot run: {err}; CPU profiling is unaffected"),
            Some("a kernel with the sched_switch tracepoint's prev_state argument (5.18+)"),
        ),
    }
}

/// The daemon's quiet and busy resident memory in the benches (`cargo xtask bench --only
/// overhead`, `--only go`; docs/benchmarks.md): what it adds to its maps.
const DAEMON_RSS_MIB: (u64, u64) = (20, 30);

/// The memory the daemon would take on this host: its BPF maps, as the kernel charges them now
/// that the program is loaded with the daemon's defaults (sized for this host's CPUs), plus
/// the unwinder's first row pool and process map (created by the daemon, not by this check),
/// plus the resident memory the benches measure.
/// Whether signed return addresses are stripped with the kernel's own mask (arm64).
#[cfg(target_arch = "aarch64")]
fn pointer_authentication() -> Item {
    use crate::arch::aarch64::pac::{address_mask, code_mask, CodeMask};
    match code_mask() {
        Ok(code @ CodeMask::Bits(bits)) => item(
            Status::Ok,
            "pointer authentication",
            format!(
                "return addresses signed in bits {bits:#018x} (the kernel's NT_ARM_PAC_MASK), \
                 stripped to {:#x}",
                address_mask(Some(code))
            ),
            None,
        ),
        Ok(CodeMask::Unsupported) => item(
            Status::Ok,
            "pointer authentication",
            "not enabled for user space: return addresses are never signed",
            None,
        ),
        Err(err) => item(
            Status::Warn,
            "pointer authentication",
            format!("{err}: return addresses are stripped to 48 bits"),
            Some("allow ptrace of the agent's own child (Yama's ptrace_scope below 3)"),
        ),
    }
}

fn footprint(cpus: usize) -> Item {
    match crate::pipeline::cost::bpf_map_memory() {
        Ok(bytes) => {
            let running = crate::sys::running_processes() as u64;
            // One entry more than the processes: the zeroed one unknown processes walk with
            // (`PROCS_NO_MAPPINGS`).
            let process_map = (u64::from(crate::unwind::initial_process_entries(
                running as usize,
                crate::pipeline::sampler::UnwindCapacity::DAEMON.processes,
            )) + 1)
                * std::mem::size_of::<scorch_common::ProcMappings>() as u64;
            let first_pool = u64::from(scorch_common::MIN_POOL_ROWS)
                * std::mem::size_of::<scorch_common::UnwindRow>() as u64;
            let maps = (bytes + process_map + first_pool) >> 20;
            item(
                Status::Ok,
                "expected footprint",
                format!(
                    "BPF maps {maps} MiB at the defaults for {cpus} CPUs and {running} \
                     processes; the unwinder's row pools and process map grow with the tables \
                     and processes sampled, up to 64 MiB and 20 MiB more (--unwind-pool-mib, \
                     --unwind-processes). With the daemon's RSS ({}-{} MiB in \
                     docs/benchmarks.md) about {}-{} MiB in all",
                    DAEMON_RSS_MIB.0,
                    DAEMON_RSS_MIB.1,
                    maps + DAEMON_RSS_MIB.0,
                    maps + DAEMON_RSS_MIB.1
                ),
                None,
            )
        }
        Err(err) => item(
            Status::Warn,
            "expected footprint",
            format!("the BPF maps' memory cannot be read from /proc/self/fdinfo: {err}"),
            None,
        ),
    }
}

/// Whether the binaries of processes that are not this user's can be opened through
/// /proc/PID/root: the only way to a binary that exists inside a container alone. PID 1 stands
/// for them: it is root's, and holds every capability.
fn other_processes(caps: Capabilities) -> Item {
    let name = "other processes";
    if caps.has(CAP_SYS_PTRACE) {
        return item(
            Status::Ok,
            name,
            "CAP_SYS_PTRACE: every process's binaries, containers' included",
            None,
        );
    }
    match std::fs::read_dir("/proc/1/root") {
        Ok(_) => item(Status::Ok, name, "/proc/1/root readable", None),
        Err(err) => item(
            Status::Warn,
            name,
            format!(
                "/proc/1/root: {err}; without CAP_SYS_PTRACE, binaries of other users' \
                 processes that exist only inside a container will be unnamed"
            ),
            Some("grant CAP_SYS_PTRACE, or run as root"),
        ),
    }
}

/// Whether /proc/PID/map_files opens for other users' processes: the only way to a binary
/// deleted or replaced (by a package upgrade) since its process started. Optional, because the
/// capabilities it takes also let scorch read any file.
fn replaced_binaries(caps: Capabilities) -> Item {
    let name = "replaced binaries";
    let maps = std::fs::read_to_string("/proc/1/maps");
    let both = caps.has(CAP_CHECKPOINT_RESTORE) && caps.has(CAP_DAC_READ_SEARCH);
    if maps.is_err() && both {
        // PID 1 hides even its maps (a sandbox's supervisor, an init outside this user
        // namespace), so nothing here can be tried on it; the capabilities are what count.
        return item(
            Status::Ok,
            name,
            "CAP_CHECKPOINT_RESTORE and CAP_DAC_READ_SEARCH (PID 1 not inspectable)",
            None,
        );
    }
    let mapped = maps.ok().and_then(|maps| {
        maps.lines()
            .find(|line| line.contains(" /"))
            .and_then(|line| line.split(' ').next().and_then(map_files_name))
    });
    let opened = mapped
        .as_ref()
        .is_some_and(|range| std::fs::metadata(format!("/proc/1/map_files/{range}")).is_ok());
    if opened {
        return item(Status::Ok, name, "/proc/PID/map_files readable", None);
    }
    let mut missing = Vec::new();
    if !caps.has(CAP_CHECKPOINT_RESTORE) {
        missing.push("CAP_CHECKPOINT_RESTORE");
    }
    if !caps.has(CAP_DAC_READ_SEARCH) {
        missing.push("CAP_DAC_READ_SEARCH");
    }
    item(
        Status::Warn,
        name,
        format!(
            "/proc/PID/map_files unreadable{}: binaries deleted or replaced since their process \
             started will be unnamed",
            if missing.is_empty() {
                String::new()
            } else {
                format!(" without {}", missing.join(" and "))
            }
        ),
        Some("optional: grant both, or run as root (they also let scorch read any file)"),
    )
}

/// True when every check lets profiling work.
pub fn can_profile(items: &[Item]) -> bool {
    items.iter().all(|i| i.status != Status::Fail)
}

fn read_sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn kallsyms_addresses_visible() -> bool {
    std::fs::File::open("/proc/kallsyms")
        .is_ok_and(|file| kallsyms_shows_addresses(std::io::BufReader::new(file)))
}

/// Whether a kallsyms listing shows real addresses: true at the first code symbol (`t`/`T`)
/// with a non-zero address. The first line alone does not tell: on Debian's 6.1 and 6.12 it
/// is the per-CPU `0000000000000000 A fixed_percpu_data`, zero even when nothing is hidden,
/// while a hidden listing shows every address as zero.
fn kallsyms_shows_addresses(listing: impl std::io::BufRead) -> bool {
    listing.lines().map_while(Result::ok).any(|line| {
        let mut fields = line.split(' ');
        let address = fields.next().and_then(|a| u64::from_str_radix(a, 16).ok());
        let code = matches!(fields.next(), Some("t" | "T"));
        code && address.is_some_and(|a| a != 0)
    })
}

/// `/proc/PID/maps` range (`00400000-00401000`: zero-padded to 8 digits) -> its name under
/// `/proc/PID/map_files` (`400000-401000`: never padded), so that a non-PIE binary mapped
/// below 4 GiB is found.
fn map_files_name(range: &str) -> Option<String> {
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    Some(format!("{start:x}-{end:x}"))
}

/// `6.1.0-18-amd64` -> (6, 1).
pub fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions() {
        assert_eq!(parse_kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(parse_kernel_version("6.18.44-fc-v595"), Some((6, 18)));
        assert_eq!(parse_kernel_version("4.9"), Some((4, 9)));
        assert_eq!(parse_kernel_version("garbage"), None);
    }

    #[test]
    fn kallsyms_zero_first_line_is_not_hiding() {
        // Debian 6.1/6.12: a per-CPU symbol at 0 comes first, real text addresses follow.
        let visible = "0000000000000000 A fixed_percpu_data\n\
                       0000000000000000 A __per_cpu_start\n\
                       ffffffff81000000 T startup_64\n";
        assert!(kallsyms_shows_addresses(visible.as_bytes()));
        // kptr_restrict hiding them: every address zero.
        let hidden = "0000000000000000 A fixed_percpu_data\n\
                      0000000000000000 T startup_64\n\
                      0000000000000000 t do_one_initcall\n";
        assert!(!kallsyms_shows_addresses(hidden.as_bytes()));
        // A non-zero data symbol alone does not prove text addresses are shown.
        assert!(!kallsyms_shows_addresses(
            "0000000000001000 D some_data\n0000000000000000 T f\n".as_bytes()
        ));
        assert!(!kallsyms_shows_addresses("".as_bytes()));
    }

    #[test]
    fn map_files_names_are_not_padded() {
        assert_eq!(
            map_files_name("00400000-00401000").as_deref(),
            Some("400000-401000")
        );
        assert_eq!(
            map_files_name("7f3a1c000000-7f3a1c021000").as_deref(),
            Some("7f3a1c000000-7f3a1c021000")
        );
        assert_eq!(map_files_name("garbage"), None);
    }

    #[test]
    fn item_lines_read_well() {
        let line = item(
            Status::Fail,
            "privileges",
            "uid 1000",
            Some("run with sudo"),
        )
        .to_string();
        assert_eq!(
            line,
            "FAIL privileges             uid 1000 -> run with sudo"
        );
        assert!(!can_profile(&[item(Status::Fail, "x", "", None)]));
        assert!(can_profile(&[item(Status::Warn, "x", "", None)]));
    }
}
