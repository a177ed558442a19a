//! TEMPORARY (replaced by the hotspot-names branch at merge).
use super::Layout;
use std::sync::Arc;
pub struct Process {
    pub layout: Arc<Layout>,
}
#[derive(Default)]
pub struct HotspotNames;
impl crate::runtimes::Names for HotspotNames {
    fn attach(&mut self, _: u32, _: Option<Arc<dyn std::any::Any + Send + Sync>>) {}
    fn capture(&mut self, _: u32, _: u64) {}
    fn end_window(&mut self, _: &dyn Fn(u32) -> bool) {}
    fn line(&mut self, _: u32, _: u64) -> crate::profile::Line {
        crate::profile::Line::named("x")
    }
    fn counts(&self) -> (u64, u64) {
        (0, 0)
    }
}
