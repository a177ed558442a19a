//! A HotSpot JVM's version: its string (`Abstract_VM_Version::_s_vm_release`, such as
//! `17.0.15+6-Debian-1deb12u1`) and numbers, read from its memory through the statics its
//! vmStructs table gives.
//!
//! The feature release is taken from `JDK_Version::_current` where the table has it (to JDK
//! 21): JDK 8's string and `Abstract_VM_Version` numbers are HotSpot's own (25), not Java's.
//! Where both a number and a parsable string are there they must agree, or the memory is not
//! the JVM it claims to be.

use super::vmstructs::{read_c_string, Field, VmStructs};
use crate::runtimes::memory::{read_i32, read_u64, read_u8, Memory};

/// Longest version string read.
const MAX_RELEASE: usize = 256;

/// Why a JVM's version was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("no Abstract_VM_Version._s_vm_release in its vmStructs")]
    NoRelease,
    #[error("the JVM's version string at {address:#x} is unreadable or too long")]
    Release { address: u64 },
    #[error("the JVM's version is not yet set (JDK_Version is still 0): the JVM is starting")]
    NotYetSet,
    #[error("the JVM's version {release:?} says {parsed}, its numbers {major}")]
    Disagrees {
        release: String,
        parsed: u32,
        major: u32,
    },
    #[error("the JVM's version {release:?}: no major version")]
    NoVersion { release: String },
    #[error("the JVM's version number at {address:#x}: unreadable")]
    Unreadable { address: u64 },
}

/// A JVM's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The Java feature release (`17`), from `JDK_Version` where the table has it (to 21;
    /// JDK 8's own numbers are HotSpot's, 25), else `Abstract_VM_Version` or the string.
    pub major: u32,
    pub minor: u32,
    pub security: u32,
    pub build: u32,
    /// `Abstract_VM_Version::_s_vm_release` (`17.0.15+6-Debian-1deb12u1`).
    pub release: String,
}

/// The JVM's version: `_s_vm_release` read from `memory` (libjvm at `bias`), with the
/// numbers `JDK_Version` or `Abstract_VM_Version` keep.
pub fn read(memory: &dyn Memory, tables: &VmStructs, bias: u64) -> Result<Version, VersionError> {
    let release_at = match tables.field("Abstract_VM_Version", "_s_vm_release") {
        Some(Field::Static(address)) => address.wrapping_add(bias),
        _ => return Err(VersionError::NoRelease),
    };
    let pointer = read_u64(memory, release_at).ok_or(VersionError::Release {
        address: release_at,
    })?;
    let release = read_c_string(memory, pointer, MAX_RELEASE)
        .map_err(|_| VersionError::Release { address: pointer })?;
    let number = |type_name: &str, field: &str| -> Result<Option<u32>, VersionError> {
        let Some(Field::Static(address)) = tables.field(type_name, field) else {
            return Ok(None);
        };
        let address = address.wrapping_add(bias);
        let value = read_i32(memory, address).ok_or(VersionError::Unreadable { address })?;
        Ok(u32::try_from(value).ok())
    };
    // `JDK_Version::_current` starts with its `uint8_t _major`; JDK 8's is Java's 8 where
    // Abstract_VM_Version's numbers are HotSpot's 25.
    let jdk_major = match tables.field("JDK_Version", "_current") {
        Some(Field::Static(address)) => {
            let address = address.wrapping_add(bias);
            match read_u8(memory, address).ok_or(VersionError::Unreadable { address })? {
                0 => return Err(VersionError::NotYetSet),
                major => Some(u32::from(major)),
            }
        }
        _ => None,
    };
    let vm_major = number("Abstract_VM_Version", "_vm_major_version")?;
    let parsed = parse_release(&release);
    let major = match (jdk_major.or(vm_major), parsed) {
        (Some(major), Some(parsed)) if parsed.0 != major => {
            return Err(VersionError::Disagrees {
                parsed: parsed.0,
                major,
                release,
            })
        }
        (Some(major), _) => major,
        (None, Some(parsed)) => parsed.0,
        (None, None) => return Err(VersionError::NoVersion { release }),
    };
    let (minor, security, build) = match parsed {
        Some((_, minor, security, build)) => (minor, security, build),
        None => (
            number("Abstract_VM_Version", "_vm_minor_version")?.unwrap_or(0),
            number("Abstract_VM_Version", "_vm_security_version")?.unwrap_or(0),
            number("Abstract_VM_Version", "_vm_build_number")?.unwrap_or(0),
        ),
    };
    Ok(Version {
        major,
        minor,
        security,
        build,
        release,
    })
}

/// (major, minor, security, build) of a Java version string (`17.0.15+6-Debian-1deb12u1`,
/// `21-ea+5`); `None` for JDK 8's HotSpot numbering (`25.402-b06`), whose first number is
/// not Java's.
pub fn parse_release(release: &str) -> Option<(u32, u32, u32, u32)> {
    let end = release.find(['+', '-']).unwrap_or(release.len());
    let (numbers, rest) = release.split_at(end);
    if rest
        .strip_prefix("-b")
        .is_some_and(|b| b.starts_with(|c: char| c.is_ascii_digit()))
    {
        return None;
    }
    let mut parts = numbers.split('.').map(|n| n.parse::<u32>().ok());
    let major = parts.next().flatten()?;
    let minor = parts.next().flatten().unwrap_or(0);
    let security = parts.next().flatten().unwrap_or(0);
    let build = rest
        .find('+')
        .map(|plus| {
            rest[plus + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0);
    Some((major, minor, security, build))
}
