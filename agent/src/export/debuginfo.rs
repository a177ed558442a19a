//! Debug-info upload to Parca: with `--symbolize none` the server names the frames, so it
//! needs the symbols and DWARF of every binary the profiles point into.
//!
//! ```text
//! symbolize/user.rs (build id read) -> DebugFile -> extract_debug -> DebuginfoService
//!   ShouldInitiateUpload -> InitiateUpload -> Upload stream | signed-URL PUT -> MarkUploadFinished
//! ```
//!
//! The symboliser hands over each mapped file (or its separate debug file) once, as it reads
//! its build id, through a bounded channel it never waits on; the uploader takes each build id
//! once per run, at most [`MAX_IN_FLIGHT`] at a time, on the sink's thread, sharing the Parca
//! sink's gRPC connection and credentials. What is sent is [`extract_debug`]'s output: the
//! file with only what a symboliser reads, like `objcopy --only-keep-debug` (the rewriting is
//! `symbolize::elf::extract`'s: ELF is the symboliser's to know, the upload is this file's).
//! That can be hundreds of MB, more than the daemon's whole memory target, so it goes to an anonymous
//! temporary file and is sent from there a chunk at a time.
//!
//! Failures follow the sink's policy: transient ones are retried with backoff a few times,
//! refusals are not; either way a build id that failed is logged once and not tried again in
//! this run (the next start asks the server again).

use std::{
    collections::HashSet,
    fs::File,
    future::Future,
    io::{self, BufWriter, Write},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use md5::{Digest as _, Md5};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::{JoinHandle, JoinSet},
};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use super::{
    parca::{self, Credentialed},
    proto::parca::debuginfo::v1alpha1::{
        debuginfo_service_client::DebuginfoServiceClient, upload_instructions::UploadStrategy,
        upload_request, InitiateUploadRequest, MarkUploadFinishedRequest,
        ShouldInitiateUploadRequest, UploadInfo, UploadRequest,
    },
    wait, Backoff, ClientSettings, FailureReason, RemoteMetrics, SendError, SinkError,
    BACKOFF_BASE, BACKOFF_CAP,
};
use crate::symbolize::elf::{
    extract::{write_debug, ExtractError},
    FileData,
};

/// Uploads at once: each has an extracted file on disk and a chunk or two of it in memory, and
/// the sender shares the thread.
pub const MAX_IN_FLIGHT: usize = 2;

/// Files the symboliser may hand over before the uploader takes them; more are dropped (and
/// offered again at the next start).
pub const CHANNEL_CAPACITY: usize = 64;

/// Attempts per step of one upload before it is given up for this run.
const MAX_ATTEMPTS: u32 = 4;

/// The size of each `chunk_data` message (and of each read of the extracted file, for either
/// strategy): well under the 4 MiB a gRPC server takes by default.
const CHUNK_BYTES: usize = 512 << 10;

/// The extracted file is written through this much buffer: the ELF writer's small writes
/// (headers, padding in 1 KiB pieces) become few system calls; section contents, larger,
/// go straight through.
const WRITE_BUFFER_BYTES: usize = 64 << 10;

/// The slowest link an upload is given time for, on top of the request timeout: a 100 MiB
/// debug file gets 100 s more.
const MIN_UPLOAD_BYTES_PER_SEC: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DebuginfoError {
    /// The file could not be reduced to what is uploaded.
    #[error(transparent)]
    Extract(ExtractError),
    /// The extracted file's own I/O (a full disk, most likely): nothing the server did.
    #[error("{path}: {doing} its extracted debug info (a temporary file in the store directory): {source}")]
    TempFile {
        path: PathBuf,
        doing: &'static str,
        source: io::Error,
    },
    #[error("{path}: creating a temporary file in {dir} for its extracted debug info: {source}", dir = .dir.display())]
    TempDir {
        path: PathBuf,
        dir: PathBuf,
        source: io::Error,
    },
    #[error("uploading the debug info of {path} ({build_id}): {step}: {message}")]
    Refused {
        path: PathBuf,
        build_id: String,
        step: &'static str,
        message: String,
    },
    #[error(
        "uploading the debug info of {path} ({build_id}): {step} failed {attempts} times, \
         giving up until the next start: {message}"
    )]
    GaveUp {
        path: PathBuf,
        build_id: String,
        step: &'static str,
        attempts: u32,
        message: String,
    },
}

impl From<ExtractError> for DebuginfoError {
    fn from(err: ExtractError) -> Self {
        match err {
            // The writer is the temporary file: say so, and where it is.
            ExtractError::Output { path, source } => DebuginfoError::TempFile {
                path,
                doing: "writing",
                source,
            },
            err => DebuginfoError::Extract(err),
        }
    }
}

/// A file to upload: what the symboliser found (see `UserSymbolizer::take_new_binaries`).
pub use crate::symbolize::user::NewBinary as DebugFile;

/// The symboliser's end of the hand-off.
pub type DebugFileSender = mpsc::Sender<DebugFile>;
/// The uploader's end.
pub type DebugFileReceiver = mpsc::Receiver<DebugFile>;

/// The channel between the symboliser and the uploader.
pub fn hand_off() -> (DebugFileSender, DebugFileReceiver) {
    mpsc::channel(CHANNEL_CAPACITY)
}

/// What is uploaded of `elf`: [`write_debug`]'s debug-only copy of it, written to an anonymous
/// temporary file in `dir` and hashed on the way (InitiateUpload wants the MD5 first); the heap
/// holds only the section plan and a write buffer. The daemon passes the store's directory: it
/// is on disk, where the store's own space is planned, while `/tmp` is often RAM (tmpfs, or a
/// Kubernetes emptyDir with a small limit) and these files can be hundreds of MB.
pub fn extract_debug(
    elf: &[u8],
    path: &Path,
    dir: &Path,
) -> Result<ExtractedDebug, DebuginfoError> {
    let file = tempfile::tempfile_in(dir).map_err(|source| DebuginfoError::TempDir {
        path: path.to_owned(),
        dir: dir.to_owned(),
        source,
    })?;
    let out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, HashingWriter::new(file));
    let out = write_debug(elf, path, out)?;
    let hashed = out
        .into_inner()
        .map_err(|e| temp_file_error(path, "writing", e.into_error()))?;
    Ok(ExtractedDebug {
        file: Arc::new(hashed.inner),
        size: hashed.len,
        md5: format!("{:x}", hashed.md5.finalize()),
    })
}

fn temp_file_error(path: &Path, doing: &'static str, source: io::Error) -> DebuginfoError {
    DebuginfoError::TempFile {
        path: path.to_owned(),
        doing,
        source,
    }
}

/// [`extract_debug`]'s output.
#[derive(Debug)]
pub struct ExtractedDebug {
    /// Unnamed, so it is gone with the last handle, however scorch ends. Shared by the
    /// attempts of the upload, each reading it from the start with `pread`.
    file: Arc<File>,
    size: u64,
    /// Lowercase hex, as InitiateUpload wants it.
    md5: String,
}

/// A writer that hashes what it passes on, so the file is not read back only for its MD5.
struct HashingWriter<W> {
    inner: W,
    md5: Md5,
    /// Bytes written: the file's size once the buffer above is flushed.
    len: u64,
}

impl<W> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            md5: Md5::new(),
            len: 0,
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        // Only what the file took: a short write is retried with the rest.
        self.md5.update(&buf[..written]);
        self.len += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// How one build id's upload ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadResult {
    Uploaded,
    /// The server has it (or does not want it): `should_initiate_upload` was false.
    AlreadyPresent,
    /// The file has no symbols or DWARF.
    NothingToUpload,
    Failed,
}

impl UploadResult {
    pub const ALL: [UploadResult; 4] = [
        UploadResult::Uploaded,
        UploadResult::AlreadyPresent,
        UploadResult::NothingToUpload,
        UploadResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UploadResult::Uploaded => "uploaded",
            UploadResult::AlreadyPresent => "already_present",
            UploadResult::NothingToUpload => "nothing_to_upload",
            UploadResult::Failed => "failed",
        }
    }
}

type Client = DebuginfoServiceClient<InterceptedService<Channel, Credentialed>>;

/// What every upload shares; cheap to clone into each upload's task.
#[derive(Clone)]
struct Shared {
    client: Client,
    /// For signed-URL uploads, with the remote's TLS settings.
    http: reqwest::Client,
    timeout: Duration,
    metrics: Arc<RemoteMetrics>,
    stop: watch::Receiver<bool>,
    /// Where extracted files are written (see [`extract_debug`]).
    temp_dir: PathBuf,
}

/// Takes files from the symboliser and uploads each build id once.
pub struct Uploader {
    shared: Shared,
    files: DebugFileReceiver,
    /// Build ids taken this run, whatever came of them.
    seen: HashSet<String>,
}

impl Uploader {
    /// Shares the Parca sink's connection; must run inside a tokio runtime.
    pub fn new(
        connection: &parca::Connection,
        settings: &ClientSettings,
        files: DebugFileReceiver,
        metrics: Arc<RemoteMetrics>,
        stop: watch::Receiver<bool>,
        temp_dir: PathBuf,
    ) -> Result<Uploader, SinkError> {
        // No overall timeout: each request gets one scaled to what it carries.
        let http = settings.http_client("parca debuginfo", None)?;
        let client = DebuginfoServiceClient::with_interceptor(
            connection.channel.clone(),
            connection.credentials.clone(),
        );
        Ok(Uploader {
            shared: Shared {
                client,
                http,
                timeout: settings.timeout,
                metrics,
                stop,
                temp_dir,
            },
            files,
            seen: HashSet::new(),
        })
    }

    /// Uploads until the sink stops; uploads still running then are abandoned (the server
    /// lets a stale upload be started again).
    pub async fn run(mut self) {
        let mut stop = self.shared.stop.clone();
        let mut in_flight = JoinSet::new();
        let mut open = true;
        loop {
            tokio::select! {
                _ = stop.wait_for(|&s| s) => break,
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
                file = self.files.recv(), if open && in_flight.len() < MAX_IN_FLIGHT => {
                    let Some(file) = file else {
                        open = false;
                        continue;
                    };
                    if self.seen.insert(file.build_id.clone()) {
                        in_flight.spawn(upload(self.shared.clone(), file));
                    }
                }
            }
        }
        in_flight.abort_all();
    }
}

/// One build id, start to end, counted and logged.
async fn upload(shared: Shared, file: DebugFile) {
    let metrics = shared.metrics.clone();
    let DebugFile {
        build_id,
        path,
        data,
    } = file;
    let result = match upload_file(&shared, &build_id, &path, data).await {
        Ok(result) => {
            if result == UploadResult::Uploaded {
                tracing::debug!("uploaded the debug info of {} ({build_id})", path.display());
            }
            result
        }
        Err(err @ DebuginfoError::Extract(ExtractError::NoSymbols { .. })) => {
            tracing::debug!("{err}");
            UploadResult::NothingToUpload
        }
        Err(err) => {
            tracing::warn!("{err}");
            UploadResult::Failed
        }
    };
    metrics.debuginfo_upload(result);
}

async fn upload_file(
    shared: &Shared,
    build_id: &str,
    path: &Path,
    data: FileData,
) -> Result<UploadResult, DebuginfoError> {
    let mut steps = Steps {
        shared,
        build_id,
        path,
    };
    // The hash lets a server tell a new upload from one it already judged invalid; it is only
    // known after extracting, which the server usually makes unnecessary, so the first
    // question goes without one.
    let should = steps
        .call("ShouldInitiateUpload", shared.timeout, |mut client| {
            let request = with_deadline(
                ShouldInitiateUploadRequest {
                    build_id: build_id.to_owned(),
                    ..Default::default()
                },
                shared.timeout,
            );
            async move { client.should_initiate_upload(request).await }
        })
        .await?;
    if !should.should_initiate_upload {
        tracing::debug!(
            "the server has the debug info of {} ({build_id}): {}",
            path.display(),
            should.reason
        );
        return Ok(UploadResult::AlreadyPresent);
    }
    // Extracting copies every debug section (hundreds of MB for some binaries): off the
    // thread the window sender shares.
    let owned_path = path.to_owned();
    let temp_dir = shared.temp_dir.clone();
    let debug = tokio::task::spawn_blocking(move || {
        let extracted = extract_debug(data.bytes(), &owned_path, &temp_dir);
        // Not kept for the transfer, which can take minutes: a mapping's pages are the
        // kernel's to drop, but `FileData::Owned` is heap.
        drop(data);
        extracted
    })
    .await
    .map_err(|e| steps.refused("extracting", e.to_string()))??;
    let size = debug.size;
    let hash = debug.md5.clone();
    let initiated = steps
        .call("InitiateUpload", shared.timeout, |mut client| {
            let request = with_deadline(
                InitiateUploadRequest {
                    build_id: build_id.to_owned(),
                    size: size as i64,
                    hash: hash.clone(),
                    ..Default::default()
                },
                shared.timeout,
            );
            async move { client.initiate_upload(request).await }
        })
        .await?;
    let Some(instructions) = initiated.upload_instructions else {
        return Err(steps.refused("InitiateUpload", "no upload instructions".into()));
    };
    let transfer_timeout = shared.timeout + Duration::from_secs(size / MIN_UPLOAD_BYTES_PER_SEC);
    match UploadStrategy::try_from(instructions.upload_strategy) {
        Ok(UploadStrategy::Grpc) => {
            let upload_id = instructions.upload_id.clone();
            steps
                .retry("Upload", || {
                    let mut client = shared.client.clone();
                    let (chunks, read_failed) = read_chunks(&debug);
                    let messages = upload_messages(build_id, &upload_id, chunks);
                    let request = with_deadline(messages, transfer_timeout);
                    unless_read_fails(
                        async move { grpc_attempt(transfer_timeout, client.upload(request)).await },
                        read_failed,
                    )
                })
                .await?
                .map_err(|source| temp_file_error(path, "reading", source))?;
        }
        Ok(UploadStrategy::SignedUrl) => {
            steps
                .retry("PUT to the signed URL", || {
                    let (chunks, read_failed) = read_chunks(&debug);
                    unless_read_fails(
                        put(
                            shared,
                            &instructions.signed_url,
                            chunks,
                            size,
                            transfer_timeout,
                        ),
                        read_failed,
                    )
                })
                .await?
                .map_err(|source| temp_file_error(path, "reading", source))?;
        }
        _ => {
            return Err(steps.refused(
                "InitiateUpload",
                format!("unknown upload strategy {}", instructions.upload_strategy),
            ))
        }
    }
    steps
        .call("MarkUploadFinished", shared.timeout, |mut client| {
            let request = with_deadline(
                MarkUploadFinishedRequest {
                    build_id: build_id.to_owned(),
                    upload_id: instructions.upload_id.clone(),
                },
                shared.timeout,
            );
            async move { client.mark_upload_finished(request).await }
        })
        .await?;
    shared.metrics.debuginfo_uploaded_bytes(size);
    Ok(UploadResult::Uploaded)
}

/// A call whose deadline travels as `grpc-timeout`: the server gives up on what this side
/// gave up on, and the channel (which has no timeout of its own) enforces it here too.
fn with_deadline<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// One gRPC attempt with a deadline, its failure classified for [`Steps::retry`].
async fn grpc_attempt<T>(
    timeout: Duration,
    attempt: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, SendError> {
    // The call's deadline starts only once the channel hands it to a connection; this bounds
    // the wait for one as well.
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(parca::classify_status(&status)),
        Err(_) => Err(SendError::Retryable {
            reason: FailureReason::Timeout,
            message: format!("no answer within {timeout:?}"),
            retry_after: None,
        }),
    }
}

/// A transfer attempt, ended early if reading the extracted file for it fails: that failure
/// is ours, not the server's, so it ends the upload (`Ok(Err)`, which is not retried) and the
/// dropped attempt leaves the server with an unfinished upload rather than a short file.
async fn unless_read_fails<T>(
    attempt: impl Future<Output = Result<T, SendError>>,
    read_failed: oneshot::Receiver<io::Error>,
) -> Result<Result<T, io::Error>, SendError> {
    tokio::select! {
        result = attempt => result.map(Ok),
        // A closed channel (the whole file was read) disables this branch.
        Ok(error) = read_failed => Ok(Err(error)),
    }
}

/// The extracted file in chunks of at most [`CHUNK_BYTES`], each read as the consumer asks
/// for it, so a transfer holds one or two chunks whatever the file's size. A read that fails
/// is sent to the receiver and the stream then stalls: ending it would send a short file as
/// if it were whole.
fn read_chunks(debug: &ExtractedDebug) -> (FileChunks, oneshot::Receiver<io::Error>) {
    let (failed, read_failed) = oneshot::channel();
    let chunks = FileChunks {
        file: debug.file.clone(),
        offset: 0,
        end: debug.size,
        reading: None,
        failed: Some(failed),
    };
    (chunks, read_failed)
}

/// See [`read_chunks`].
struct FileChunks {
    file: Arc<File>,
    /// Where the next chunk starts: each attempt has its own (`pread`, no shared cursor).
    offset: u64,
    end: u64,
    /// The read in progress, on the blocking pool: the file may have left the page cache,
    /// and the window sender shares this thread.
    reading: Option<JoinHandle<io::Result<Vec<u8>>>>,
    /// Taken by the first failed read; `None` afterwards means stalled.
    failed: Option<oneshot::Sender<io::Error>>,
}

impl Stream for FileChunks {
    type Item = Vec<u8>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        let this = self.get_mut();
        if this.failed.is_none() {
            // Woken by nothing: whoever waits on the receiver drops this stream.
            return Poll::Pending;
        }
        if this.offset >= this.end {
            return Poll::Ready(None);
        }
        let reading = this.reading.get_or_insert_with(|| {
            let file = this.file.clone();
            let offset = this.offset;
            let len = (this.end - offset).min(CHUNK_BYTES as u64) as usize;
            tokio::task::spawn_blocking(move || {
                let mut chunk = vec![0; len];
                file.read_exact_at(&mut chunk, offset).map(|()| chunk)
            })
        });
        let read = ready!(Pin::new(reading).poll(cx));
        this.reading = None;
        match read.unwrap_or_else(|joining| Err(io::Error::other(joining))) {
            Ok(chunk) => {
                this.offset += chunk.len() as u64;
                Poll::Ready(Some(chunk))
            }
            Err(error) => {
                if let Some(failed) = this.failed.take() {
                    // The receiver is gone only if the attempt already ended.
                    let _ = failed.send(error);
                }
                Poll::Pending
            }
        }
    }
}

/// The Upload stream: who is uploading, then the file in chunks.
fn upload_messages(
    build_id: &str,
    upload_id: &str,
    chunks: FileChunks,
) -> impl Stream<Item = UploadRequest> + Send + 'static {
    let info = UploadRequest {
        data: Some(upload_request::Data::Info(UploadInfo {
            build_id: build_id.to_owned(),
            upload_id: upload_id.to_owned(),
        })),
    };
    tokio_stream::once(info).chain(chunks.map(|chunk| UploadRequest {
        data: Some(upload_request::Data::ChunkData(chunk)),
    }))
}

/// A signed-URL upload: the object store wants the length up front, and no credentials of
/// ours (the URL carries its own).
async fn put(
    shared: &Shared,
    url: &str,
    chunks: FileChunks,
    size: u64,
    timeout: Duration,
) -> Result<(), SendError> {
    let body = reqwest::Body::wrap_stream(chunks.map(Ok::<_, std::convert::Infallible>));
    let response = shared
        .http
        .put(url)
        .timeout(timeout)
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(body)
        .send()
        .await
        // The signed URL is a credential (anyone holding it may write the object until it
        // expires): keep it out of the error, which is logged.
        .map_err(|e| super::pyroscope::transport_error(&e.without_url()))?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(());
    }
    let body = super::pyroscope::error_body(response, 512).await;
    let message = format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim());
    super::classify_http_status(status, message, None)
}

/// Runs the steps of one upload with the sink's retry policy.
struct Steps<'a> {
    shared: &'a Shared,
    build_id: &'a str,
    path: &'a Path,
}

impl Steps<'_> {
    fn refused(&self, step: &'static str, message: String) -> DebuginfoError {
        DebuginfoError::Refused {
            path: self.path.to_owned(),
            build_id: self.build_id.to_owned(),
            step,
            message,
        }
    }

    /// A gRPC call with a deadline, retried as [`Self::retry`] says.
    async fn call<T, F, Fut>(
        &mut self,
        step: &'static str,
        timeout: Duration,
        mut call: F,
    ) -> Result<T, DebuginfoError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.shared.client.clone();
        self.retry(step, || grpc_attempt(timeout, call(client.clone())))
            .await
    }

    /// Transient failures are tried again, [`MAX_ATTEMPTS`] in all; a refusal at once ends
    /// the upload.
    async fn retry<T, F, Fut>(
        &mut self,
        step: &'static str,
        mut attempt: F,
    ) -> Result<T, DebuginfoError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, SendError>>,
    {
        let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
        let mut stop = self.shared.stop.clone();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match attempt().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match error {
                SendError::Rejected { message, .. } => return Err(self.refused(step, message)),
                SendError::Retryable { .. } if attempts >= MAX_ATTEMPTS || *stop.borrow() => {
                    return Err(DebuginfoError::GaveUp {
                        path: self.path.to_owned(),
                        build_id: self.build_id.to_owned(),
                        step,
                        attempts,
                        message: error.message().to_owned(),
                    });
                }
                SendError::Retryable { .. } => {
                    tracing::debug!(
                        "uploading the debug info of {}: {step}: {}; retrying",
                        self.path.display(),
                        error.message()
                    );
                    let delay = super::delay_after(&mut backoff, &error, fastrand::f64());
                    if !wait(delay, &mut stop).await {
                        return Err(DebuginfoError::GaveUp {
                            path: self.path.to_owned(),
                            build_id: self.build_id.to_owned(),
                            step,
                            attempts,
                            message: "stopping".into(),
                        });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::elf::extract::tests::build_program;
    use object::SectionKind;

    /// What the steps of an upload share, with a client that is never called.
    fn shared(stop: watch::Receiver<bool>) -> Shared {
        let settings = ClientSettings::new(&crate::export::RemoteConfig {
            url: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let connection = parca::Connection::new(&settings, "parca").unwrap();
        Shared {
            client: DebuginfoServiceClient::with_interceptor(
                connection.channel,
                connection.credentials,
            ),
            http: reqwest::Client::new(),
            timeout: Duration::from_secs(1),
            metrics: Arc::new(RemoteMetrics::register(&mut crate::metrics::Registry::new())),
            stop,
            temp_dir: std::env::temp_dir(),
        }
    }

    #[test]
    fn transient_failures_are_retried_a_few_times_refusals_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (_stop, stopped) = watch::channel(false);
            let shared = shared(stopped);
            let path = Path::new("/usr/lib/libx.so");
            let mut steps = Steps {
                shared: &shared,
                build_id: "ab12",
                path,
            };
            let unavailable = || SendError::Retryable {
                reason: FailureReason::Unavailable,
                message: "down".into(),
                retry_after: None,
            };
            // Down twice, then up.
            let mut calls = 0;
            let result = steps
                .retry("InitiateUpload", || {
                    calls += 1;
                    let answer = if calls < 3 { Err(unavailable()) } else { Ok(7) };
                    async move { answer }
                })
                .await;
            assert_eq!(result.unwrap(), 7);
            assert_eq!(calls, 3);

            let mut calls = 0;
            let err = steps
                .retry("Upload", || {
                    calls += 1;
                    async { Err::<(), _>(unavailable()) }
                })
                .await
                .unwrap_err()
                .to_string();
            assert_eq!(calls, MAX_ATTEMPTS);
            assert!(
                err.contains("/usr/lib/libx.so (ab12): Upload failed 4 times"),
                "{err}"
            );

            let mut calls = 0;
            let err = steps
                .retry("InitiateUpload", || {
                    calls += 1;
                    async {
                        Err::<(), _>(parca::classify_status(&tonic::Status::invalid_argument(
                            "size too large",
                        )))
                    }
                })
                .await
                .unwrap_err()
                .to_string();
            assert_eq!(calls, 1);
            assert!(err.contains("InitiateUpload"), "{err}");
            assert!(err.contains("size too large"), "{err}");
        });
    }

    #[test]
    fn the_extracted_file_is_on_disk_with_its_size_and_md5() {
        let dir = tempfile::tempdir().unwrap();
        let binary = build_program(dir.path());
        let original = std::fs::read(&binary).unwrap();
        let in_memory = write_debug(&original, &binary, Vec::new()).unwrap();
        let extracted = extract_debug(&original, &binary, dir.path()).unwrap();
        assert_eq!(extracted.size, in_memory.len() as u64);
        assert_eq!(extracted.file.metadata().unwrap().len(), extracted.size);
        let mut on_disk = vec![0; in_memory.len()];
        extracted.file.read_exact_at(&mut on_disk, 0).unwrap();
        assert!(
            on_disk == in_memory,
            "the file differs from write_debug's bytes"
        );
        assert_eq!(extracted.md5, format!("{:x}", Md5::digest(&in_memory)));
    }

    /// `bytes` as if [`extract_debug`] had written them.
    fn spooled(bytes: &[u8]) -> ExtractedDebug {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        ExtractedDebug {
            file: Arc::new(file),
            size: bytes.len() as u64,
            md5: format!("{:x}", Md5::digest(bytes)),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn uploads_start_with_who_then_the_file_in_chunks() {
        let bytes: Vec<u8> = (0..(CHUNK_BYTES * 2 + 10)).map(|i| i as u8).collect();
        let debug = spooled(&bytes);
        let messages: Vec<UploadRequest> = runtime().block_on(async {
            let (chunks, _read_failed) = read_chunks(&debug);
            upload_messages("abcd", "u1", chunks).collect().await
        });
        assert_eq!(messages.len(), 4);
        assert_eq!(
            messages[0].data,
            Some(upload_request::Data::Info(UploadInfo {
                build_id: "abcd".into(),
                upload_id: "u1".into(),
            }))
        );
        let mut joined = Vec::new();
        for message in &messages[1..] {
            match &message.data {
                Some(upload_request::Data::ChunkData(chunk)) => {
                    assert!(chunk.len() <= CHUNK_BYTES);
                    joined.extend_from_slice(chunk);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(joined == bytes, "the chunks are not the file");
        // Every attempt reads the file from its start.
        let again: Vec<Vec<u8>> = runtime().block_on(read_chunks(&debug).0.collect());
        assert!(again.concat() == bytes, "a second read is not the file");
    }

    #[test]
    fn a_file_that_cannot_be_read_whole_stalls_the_upload_instead_of_ending_it() {
        let bytes = vec![7; CHUNK_BYTES + 10];
        let mut debug = spooled(&bytes);
        // Longer than the file: the second chunk comes up short.
        debug.size += 100;
        runtime().block_on(async {
            let (chunks, mut read_failed) = read_chunks(&debug);
            let mut messages = Box::pin(upload_messages("abcd", "u1", chunks));
            let mut received = 0;
            let error = loop {
                tokio::select! {
                    biased;
                    Ok(error) = &mut read_failed => break error,
                    message = messages.next() => {
                        message.expect("the stream ended after a failed read");
                        received += 1;
                    }
                }
            };
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
            // The info and the first chunk.
            assert_eq!(received, 2);
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(messages.as_mut().poll_next(&mut cx).is_pending());
        });
    }

    /// Bytes malloc has handed out and not taken back, mmapped blocks included (glibc serves
    /// large allocations with mmap, which `uordblks` leaves out).
    fn heap_bytes() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo2() };
        info.uordblks + info.hblkhd
    }

    #[test]
    fn a_large_extraction_stays_off_the_heap() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

        const DEBUG_INFO_BYTES: usize = 64 << 20;
        let elf = {
            let mut object = object::write::Object::new(
                object::BinaryFormat::Elf,
                object::Architecture::X86_64,
                object::Endianness::Little,
            );
            let section =
                object.add_section(Vec::new(), b".debug_info".to_vec(), SectionKind::Debug);
            object.set_section_data(section, vec![0x5a; DEBUG_INFO_BYTES], 1);
            object.write().unwrap()
        };
        let path = Path::new("/usr/lib/big.so");
        let before = heap_bytes();
        let peak = AtomicUsize::new(before);
        let done = AtomicBool::new(false);
        let extracted = std::thread::scope(|scope| {
            // Sampled while the file is written: a buffer the size of a section lives at
            // least as long as writing it out takes, many samples.
            scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(heap_bytes(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            let extracted = extract_debug(&elf, path, &std::env::temp_dir());
            done.store(true, Ordering::Relaxed);
            extracted.unwrap()
        });
        peak.fetch_max(heap_bytes(), Ordering::Relaxed);
        assert!(extracted.size > DEBUG_INFO_BYTES as u64);
        assert_eq!(extracted.file.metadata().unwrap().len(), extracted.size);
        // Held in memory, the output alone would be 64 MiB; the margin is for the tests
        // running beside this one in the same process.
        let grown = peak.into_inner().saturating_sub(before);
        assert!(
            grown < 16 << 20,
            "the heap grew by {} KiB extracting {} MiB",
            grown >> 10,
            DEBUG_INFO_BYTES >> 20
        );
    }
}
