//! Waiting for EC2 state changes: look until a condition holds or a
//! deadline. Looks go through the batched describer, so many waiters make
//! few calls.

use std::time::Duration;

use tokio::time::Instant;

use crate::ec2::Ec2Error;
use crate::error::ControllerError;

/// What a look at the resource decided.
pub enum Look<T> {
    /// Done, with this result.
    Done(T),
    /// Not yet; look again.
    Again,
    /// It will never get there.
    Fail(ControllerError),
}

/// How a waiter paces its looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cadence {
    /// Look again at once: the batcher holds each look until its next
    /// call, at least a window after the last, so every call serves every
    /// waiter and a state change is seen within one window.
    Batched,
    /// Each look is a call of its own: wait 0.25 s, growing by half each
    /// time, at most 5 s.
    Backoff,
}

const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);

/// Calls `look` at `cadence` until it is done or fails, or `timeout`
/// passes.
///
/// # Errors
/// The failure `look` reports, an EC2 error of a look, or UNAVAILABLE
/// naming `what` at the deadline.
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    cadence: Cadence,
    mut look: F,
) -> Result<T, ControllerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Look<T>, Ec2Error>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = FIRST_DELAY;
    loop {
        match look().await? {
            Look::Done(value) => return Ok(value),
            Look::Fail(error) => return Err(error),
            Look::Again => {
                let pause = match cadence {
                    Cadence::Batched => Duration::ZERO,
                    Cadence::Backoff => delay,
                };
                if Instant::now() + pause > deadline {
                    return Err(ControllerError::Unavailable(format!(
                        "timed out after {timeout:?} waiting for {what}"
                    )));
                }
                tokio::time::sleep(pause).await;
                delay = (delay * 3 / 2).min(MAX_DELAY);
            }
        }
    }
}
