//! The MCP 2026-07-28 flow for gated calls: the client's own retry confirms, so the model never
//! carries a token.
//!
//! Where the agent negotiated 2026-07-28 and said it handles URL-mode elicitation, a gated call
//! without confirm fields is queued in the desk as any preflight is (same queue, window, delay and
//! click) and answered at once with `resultType: input_required`: an elicitation in URL mode that
//! says the request waits in the Countersign desk and names it (`countersign://request/<id>`:
//! opening it approves nothing), and a `requestState` the engine seals (see
//! `countersign_core::request_state`) binding this connection, the tool, the plan hash, the
//! request's id and an expiry. The client retries the same call with that state (and the
//! elicitation's answer). The engine checks the retry (the state is the desk's own, for this
//! connection, tool and plan, for the request still queued, and used once: the chain lives in
//! `countersign_core::request_state`), then it waits for the person like a preflight; an approval is taken straight into the engine's confirm (the verify
//! chain, the ledger spend, the approved arguments, history) and the tool's real result is the
//! answer. Still waiting: `input_required` again with a fresh state (a bounded number of times,
//! then `pending`); denied: the refusal with the person's note; declined or cancelled at the
//! client: the request is withdrawn.
//!
//! Every other agent keeps the preflight/confirm text flow; a `requestState` from an agent on an
//! older revision, or beside confirm fields, is refused and nothing runs.

use countersign_core::PlanHash;
use countersign_core::policy::CONFIRM_ARGUMENTS;
use countersign_core::request_state::StateRefusal;
use countersign_engine::{Resumed, Unsealed};
use countersign_wire::request_url;

use super::*;

/// The key of the desk's one elicitation in `inputRequests`.
const ASK: &str = "countersign_desk";

/// How many times one call is answered `input_required` before it is answered `pending` (the
/// request stays queued: calling again re-attaches to it).
const MAX_ROUNDS: u32 = 8;

/// Whether the agent speaks 2026-07-28 on this request and said it handles URL elicitations.
fn offers_url_elicitation(context: &RequestContext<RoleServer>) -> bool {
    is_modern(context)
        && context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.url.is_some())
}

/// A refusal of a `requestState`: the code of the chain's refusal it amounts to, and a sentence
/// that says what to do.
fn state_refused(code: Refusal, why: &str) -> CallToolResponse {
    let message = format!("Refused: {why} Nothing was executed.");
    complete(refusal(code, &message))
}

fn complete(mut result: CallToolResult) -> CallToolResponse {
    result.result_type.get_or_insert(ResultType::COMPLETE);
    CallToolResponse::Complete(result)
}

/// The elicitation that points the person to the request in the desk.
fn desk_elicitation(tool: &str, id: u64) -> Option<InputRequest> {
    let message = format!(
        "Countersign: the call of `{tool}` waits for a person's decision in the Countersign desk \
         (request {id}). Read it there, then Approve or Deny it in the desk's window. Nothing runs \
         until someone clicks Approve there; answering this prompt approves nothing."
    );
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"mode": "url", "message": message, "url": request_url(id)},
    }))
    .ok()
}

impl Session {
    /// The 2026-07-28 flow for a call of the gated `request`, or `None` when the call belongs to
    /// the preflight/confirm text flow.
    pub(super) async fn rounds(
        &self,
        request: &CallToolRequestParams,
        class: GateClass,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<CallToolResponse>, ErrorData> {
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let confirming = CONFIRM_ARGUMENTS
            .iter()
            .any(|field| arguments.get(*field).is_some());
        let Some(state) = &request.request_state else {
            if confirming || !offers_url_elicitation(context) {
                return Ok(None);
            }
            let answer = match self
                .preflight(&request.name, &arguments, Duration::ZERO, context)
                .await?
            {
                Asked::Decided(answer) => answer,
                Asked::Open(opened) => {
                    let ran = self
                        .run_open(request.clone(), opened, live, context)
                        .await?;
                    return Ok(Some(complete(ran)));
                }
            };
            return self
                .after_wait(answer, request, &arguments, class, 1, live, context)
                .await
                .map(Some);
        };
        if !is_modern(context) {
            return Ok(Some(state_refused(
                Refusal::BadToken,
                "requestState belongs to MCP 2026-07-28, and this session negotiated an older \
                 revision. Next: call the tool without confirm for a preflight, and confirm with \
                 the token it returns once a person approved.",
            )));
        }
        if confirming {
            return Ok(Some(state_refused(
                Refusal::BadToken,
                "a call carries either a requestState or confirm fields, never both. Next: retry \
                 with the requestState alone, exactly as it was given.",
            )));
        }
        Ok(Some(
            self.retry(state, request, &arguments, class, live, context)
                .await?,
        ))
    }

    /// The client's retry with `state`.
    async fn retry(
        &self,
        state: &str,
        request: &CallToolRequestParams,
        arguments: &Value,
        class: GateClass,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.as_ref();
        let round = match self
            .engine
            .resume_round(&self.tenant, tool, arguments, state)
            .await
        {
            Resumed::Continue { round } => round,
            Resumed::Refused(refusal) => {
                if let StateRefusal::NotOurs(e) = &refusal {
                    tracing::warn!(target: "session", tool = %tool, "refused a requestState: {e}");
                }
                return Ok(complete(self::refusal(
                    refusal.refusal(),
                    &refusal.message(),
                )));
            }
            Resumed::NoSecret(no) => {
                let stopped = Stopped::Failed {
                    code: ErrorCode::NoSecret,
                    message: no.why,
                };
                return Ok(complete(stopped_result(stopped)));
            }
            // Decided on another replica of a team's server while the client was away.
            Resumed::Decided(stopped) => return Ok(complete(stopped_result(stopped))),
            Resumed::Unplanned => {
                // The call cannot be planned now: the preflight says why (and queues nothing).
                return match self
                    .preflight(tool, arguments, Duration::ZERO, context)
                    .await?
                {
                    Asked::Decided(answer) => Ok(complete(from_desk(answer))),
                    Asked::Open(opened) => Ok(complete(
                        self.run_open(request.clone(), opened, live, context)
                            .await?,
                    )),
                };
            }
        };
        let declined = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get(ASK))
            .and_then(|r| r.get("action"))
            .and_then(Value::as_str)
            .is_some_and(|action| action == "decline" || action == "cancel");
        if declined {
            let _ = self
                .engine
                .withdraw_aside(&self.tenant, tool, arguments)
                .await;
            let message = format!(
                "Withdrawn: the prompt to open the Countersign desk was declined, so the call of \
                 `{tool}` left the person's queue. Nothing was executed. Next: call the tool \
                 again if it must run."
            );
            return Ok(complete(failed("withdrawn", message)));
        }
        let answer = match self.preflight(tool, arguments, self.wait, context).await? {
            Asked::Decided(answer) => answer,
            Asked::Open(opened) => {
                return Ok(complete(
                    self.run_open(request.clone(), opened, live, context)
                        .await?,
                ));
            }
        };
        self.after_wait(
            answer,
            request,
            arguments,
            class,
            round.saturating_add(1),
            live,
            context,
        )
        .await
    }

    /// What the agent gets once the desk answered a preflight in this flow: the tool's result
    /// when the person approved (the approval taken straight into the confirm), `input_required`
    /// with a fresh state (`round` of [`MAX_ROUNDS`]) while the request waits, or the refusal.
    #[allow(clippy::too_many_arguments)]
    async fn after_wait(
        &self,
        answer: Result<Approved, Stopped>,
        request: &CallToolRequestParams,
        arguments: &Value,
        class: GateClass,
        round: u32,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.as_ref();
        match answer {
            Ok(Approved { token, target, .. }) => {
                // The token goes from the engine to the engine: the agent never sees it.
                let mut confirm = arguments.clone();
                confirm["confirm"] = json!(true);
                confirm["confirmTarget"] = json!(target);
                confirm["confirmToken"] = json!(token);
                let turn = self.turn().await;
                let accepted = self
                    .engine
                    .confirm_aside(&self.tenant, tool, &confirm)
                    .await;
                drop(turn);
                match accepted {
                    Ok(accepted) => {
                        let result = self
                            .run_accepted(request.clone(), accepted, class, live, context)
                            .await?;
                        Ok(complete(result))
                    }
                    Err(stopped) => Ok(complete(stopped_result(stopped))),
                }
            }
            Err(Stopped::Refused {
                refusal: Refusal::Pending,
                ..
            }) if round <= MAX_ROUNDS => match self
                .engine
                .queued_aside(&self.tenant, tool, arguments)
                .await
            {
                Some((plan, Some(id))) => match self.input_required(tool, plan, id, round).await {
                    Some(response) => Ok(response),
                    // Not shared with the other replicas yet: the text flow's `pending` (calling
                    // again finds the call wherever it lands).
                    None => Ok(complete(from_desk(answer))),
                },
                _ => Ok(complete(from_desk(answer))),
            },
            answer => Ok(complete(from_desk(answer))),
        }
    }

    /// `input_required` for request `id`: the elicitation on the first round, and a new state.
    /// `None`: no state can name the request now (a team's server could not share it).
    async fn input_required(
        &self,
        tool: &str,
        plan: PlanHash,
        id: u64,
        round: u32,
    ) -> Option<CallToolResponse> {
        let state = match self
            .engine
            .seal_round(&self.tenant, tool, plan, id, round)
            .await
        {
            Ok(state) => state,
            Err(Unsealed::NoSecret(why)) => {
                let stopped = Stopped::Failed {
                    code: ErrorCode::NoSecret,
                    message: why.why,
                };
                return Some(complete(stopped_result(stopped)));
            }
            Err(Unsealed::NotShared) => return None,
        };
        let asks = (round == 1)
            .then(|| desk_elicitation(tool, id))
            .flatten()
            .map(|ask| InputRequests::from([(ASK.to_owned(), ask)]));
        Some(CallToolResponse::InputRequired(InputRequiredResult::new(
            asks,
            Some(state),
        )))
    }
}
