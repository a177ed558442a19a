//! What this process may do: the capabilities profiling needs, read from /proc/self/status.

/// Capability bit numbers (linux/capability.h).
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYSLOG: u32 = 34;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;
pub const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// What a daemon profiling the whole machine is given (packaging/systemd/scorch.service, the
/// Kubernetes DaemonSet): CAP_BPF and CAP_PERFMON to profile at all, CAP_SYSLOG for kernel
/// symbol addresses, CAP_SYS_PTRACE to open other users' processes' files through
/// /proc/PID/root (binaries inside containers).
pub const SETCAP_HINT: &str =
    "sudo setcap cap_bpf,cap_perfmon,cap_syslog,cap_sys_ptrace+ep $(which scorch)";

/// The effective capability set of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// Reads `CapEff` from /proc/self/status; none when it cannot be read.
    pub fn effective() -> Capabilities {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| parse_cap_eff(&status))
            .map_or(Capabilities(0), Capabilities)
    }

    pub fn has(self, cap: u32) -> bool {
        self.0 & (1 << cap) != 0
    }

    /// Loading a perf_event BPF program and opening system-wide perf events needs CAP_BPF
    /// and CAP_PERFMON (kernel 5.8+), or CAP_SYS_ADMIN which implies both.
    pub fn can_profile(self) -> bool {
        self.has(CAP_SYS_ADMIN) || (self.has(CAP_BPF) && self.has(CAP_PERFMON))
    }

    /// The missing capabilities, by name, for error messages.
    pub fn missing_for_profiling(self) -> Vec<&'static str> {
        if self.can_profile() {
            return Vec::new();
        }
        let mut missing = Vec::new();
        if !self.has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !self.has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
        missing
    }
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// The one-line error for a user who cannot profile.
pub fn missing_privileges_message(caps: Capabilities) -> String {
    format!(
        "scorch needs root, or CAP_BPF and CAP_PERFMON (missing: {}); run it with sudo, or \
         grant them: {SETCAP_HINT}",
        caps.missing_for_profiling().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000000000\n";
        let caps = Capabilities(parse_cap_eff(status).unwrap());
        assert!(caps.has(CAP_BPF) && caps.has(CAP_PERFMON));
        assert!(caps.can_profile());
        assert!(Capabilities(1 << CAP_SYS_ADMIN).can_profile());
        let only_bpf = Capabilities(1 << CAP_BPF);
        assert!(!only_bpf.can_profile());
        assert_eq!(only_bpf.missing_for_profiling(), ["CAP_PERFMON"]);
        assert!(missing_privileges_message(only_bpf).contains("missing: CAP_PERFMON"));
    }
}
