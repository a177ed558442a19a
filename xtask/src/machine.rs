//! The machines scorch is built for and tested on: x86-64 (this one) and arm64 (cross-built,
//! booted under qemu). `vm-test` boots their kernels; `image` packs their runtime files.

use anyhow::{Context, Result};

/// A machine the kernels boot on: its Debian flavour, qemu, and the tools that build for it.
#[derive(Debug)]
pub struct Machine {
    /// Debian's name for the architecture (`amd64`, `arm64`).
    pub debian: &'static str,
    /// The default kernel flavour: the cloud one is small (no hardware drivers) and boots
    /// quickly.
    pub(crate) flavour: &'static str,
    /// This machine's own, or one apt fetches as a foreign architecture (`pkg:arm64`).
    pub(crate) foreign: bool,
    pub(crate) qemu: &'static str,
    /// qemu's machine and CPU.
    pub(crate) qemu_machine: &'static [&'static str],
    /// The kernel's serial console.
    pub(crate) console: &'static str,
    /// Prefix of the C toolchain that builds the workloads (`aarch64-linux-gnu-`), empty for
    /// the host's.
    pub(crate) tools: &'static str,
    /// Where that toolchain's libraries are, as the guest sees them at `/`.
    pub(crate) sysroot: &'static str,
    /// Flags added to a workload built without frame pointers: on arm64, return addresses
    /// signed with pointer authentication, which the unwinder must strip.
    pub(crate) no_frame_pointer_flags: &'static [&'static str],
    /// Flags added to a workload built with frame pointers: arm64's gcc leaves them out of
    /// leaf functions unless told, and a leaf without its frame record hides its caller from
    /// a frame-pointer walk (its return address is only in x30).
    pub(crate) frame_pointer_flags: &'static [&'static str],
    /// Go's name for the architecture (`GOARCH`).
    pub(crate) goarch: &'static str,
    /// Debian's multiarch name for it (`lib/x86_64-linux-gnu`).
    pub(crate) multiarch: &'static str,
    /// Where the guest's glibc comes from (the host's, or the cross toolchain's).
    pub(crate) libraries: &'static str,
    /// Debian packages the boot and the builds need beyond `cargo xtask setup`'s.
    pub(crate) packages: &'static [&'static str],
}

/// This machine: x86-64.
pub const X86_64: Machine = Machine {
    debian: "amd64",
    flavour: "cloud-amd64",
    foreign: false,
    qemu: "qemu-system-x86_64",
    qemu_machine: &["-cpu", "max"],
    console: "ttyS0",
    tools: "",
    sysroot: "/",
    no_frame_pointer_flags: &[],
    frame_pointer_flags: &[],
    goarch: "amd64",
    multiarch: "x86_64-linux-gnu",
    libraries: "/lib/x86_64-linux-gnu",
    packages: &[],
};

/// arm64 under TCG. `pauth-impdef=on`: the kernels sign their own return addresses, and
/// qemu's emulation of the architected algorithm (QARMA) makes a boot twice as slow.
pub const ARM64: Machine = Machine {
    debian: "arm64",
    flavour: "cloud-arm64",
    foreign: true,
    qemu: "qemu-system-aarch64",
    qemu_machine: &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
    console: "ttyAMA0",
    tools: "aarch64-linux-gnu-",
    sysroot: "/usr/aarch64-linux-gnu",
    no_frame_pointer_flags: &["-mbranch-protection=standard"],
    frame_pointer_flags: &["-mno-omit-leaf-frame-pointer"],
    goarch: "arm64",
    multiarch: "aarch64-linux-gnu",
    libraries: "/usr/aarch64-linux-gnu/lib",
    packages: &["qemu-system-arm", "gcc-aarch64-linux-gnu"],
};

impl Machine {
    /// The machine Debian names `name`.
    pub fn named(name: &str) -> Result<&'static Machine> {
        [&X86_64, &ARM64]
            .into_iter()
            .find(|m| m.debian == name || (name == "x86-64" && m.debian == "amd64"))
            .with_context(|| format!("vm-test boots amd64 (x86-64) or arm64, not {name:?}"))
    }

    pub(crate) fn tool(&self, tool: &str) -> String {
        format!("{}{tool}", self.tools)
    }

    /// A package of this architecture, as apt-get names it.
    pub(crate) fn package(&self, name: &str) -> String {
        if self.foreign {
            format!("{name}:{}", self.debian)
        } else {
            name.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_by_debian_name() {
        assert_eq!(Machine::named("arm64").unwrap().qemu, "qemu-system-aarch64");
        assert_eq!(Machine::named("amd64").unwrap().flavour, "cloud-amd64");
        assert_eq!(Machine::named("x86-64").unwrap().debian, "amd64");
        assert_eq!(ARM64.package("busybox-static"), "busybox-static:arm64");
        assert_eq!(X86_64.package("busybox-static"), "busybox-static");
        assert!(Machine::named("riscv64").is_err());
    }
}
