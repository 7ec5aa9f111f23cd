//! Waiting for EC2 state changes: look, then back off (0.25 s growing by
//! half each time, at most 5 s) until a condition holds or a deadline.
//! Looks go through the batched describer, so many waiters make few calls.

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

const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);

/// Calls `look` until it is done or fails, or `timeout` passes.
///
/// # Errors
/// The failure `look` reports, an EC2 error of a look, or UNAVAILABLE
/// naming `what` at the deadline.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut look: F) -> Result<T, ControllerError>
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
            Look::Again if Instant::now() + delay > deadline => {
                return Err(ControllerError::Unavailable(format!(
                    "timed out after {timeout:?} waiting for {what}"
                )));
            }
            Look::Again => {
                tokio::time::sleep(delay).await;
                delay = (delay * 3 / 2).min(MAX_DELAY);
            }
        }
    }
}
