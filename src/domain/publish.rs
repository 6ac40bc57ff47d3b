//! `seawall publish`: send demo `credits.requested` messages to JetStream, to
//! watch them flow through the consumer, the inbox, the outbox and the relay.

use anyhow::{Context, Result};
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};

use service::domain::credits::{CreditRequest, REQUESTED_SUBJECT};

/// Arguments of `seawall publish`.
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Account to credit.
    #[arg(long, default_value = "acct-1")]
    pub account: String,
    /// Amount in cents.
    #[arg(long, default_value_t = 100)]
    pub amount: i64,
    /// Message id (`Nats-Msg-Id`); with --count, used as a prefix.
    #[arg(long)]
    pub id: Option<String>,
    /// How many messages to send.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
}

/// Publishes and waits for every PubAck.
pub async fn run(settings: &crate::config::Settings, args: &PublishArgs) -> Result<()> {
    let nats = crate::nats::connect_with(settings, false).await?;
    let js = jetstream::new(nats.client);
    let prefix = args
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let payload = serde_json::to_vec(&CreditRequest {
        account_id: args.account.clone(),
        amount: args.amount,
        reference: None,
    })?;
    let mut acks: Vec<PublishAckFuture> = Vec::new();
    for i in 0..args.count {
        let id = if args.count == 1 {
            prefix.clone()
        } else {
            format!("{prefix}-{i}")
        };
        let msg = PublishMessage::build()
            .payload(payload.clone().into())
            .message_id(&id);
        acks.push(
            js.send_publish(REQUESTED_SUBJECT, msg)
                .await
                .context("publishing")?,
        );
    }
    let (mut stored, mut duplicates) = (0, 0);
    for ack in acks {
        if ack
            .await
            .context(
                "waiting for the PubAck (is the CREDITS stream there? start `seawall run` first)",
            )?
            .duplicate
        {
            duplicates += 1;
        } else {
            stored += 1;
        }
    }
    println!(
        "published {stored} credits.requested message(s) ({duplicates} dropped by JetStream as duplicates), id prefix {prefix}"
    );
    Ok(())
}
