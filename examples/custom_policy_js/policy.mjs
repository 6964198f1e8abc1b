// An AntDT custom policy in JavaScript: incidents in (JetStream, durable consumer), ADJUST_BS
// proposals out (request/reply), every message checked against the JSON Schemas that
// `antdt schemas export DIR` writes, every reply read by its Antdt-Reply header.
//
//   antdt schemas export schemas/
//   ANTDT_NATS__URL=nats://127.0.0.1:4222 node policy.mjs --schemas schemas/ [--job J]
//
// One JSON line per event on stdout: ready, skip, applied (or partial, failed), refused,
// retry, invalid. The rule is deliberately naive (ours, for illustration): cut the slow
// rank's even share by the measured ratio, within the bounded change that spec.get
// serves, and spread the freed samples evenly over the other ranks; the controller's
// guardrails (memory caps, bounds, cooldown) are what keep it safe.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import Ajv2020 from "ajv/dist/2020.js";
import { AckPolicy, DeliverPolicy, JSONCodec, connect, nanos } from "nats";

const INCIDENT_STREAM = "ANTDT_INCIDENTS";
const REPLY_HEADER = "Antdt-Reply";
const MESSAGES = [
  "Incident", "PlanRequest", "Plan", "SpecRequest", "SpecReply",
  "ActionProposal", "ActionRecord", "ErrorReply", "ErrorCode",
];

const { values: args } = parseArgs({
  options: {
    schemas: { type: "string" },
    job: { type: "string" },
    durable: { type: "string", default: "example-policy-js" },
    source: { type: "string", default: "example-policy-js" },
    "nats-url": { type: "string" },
  },
});
if (!args.schemas) throw new Error("--schemas DIR (antdt schemas export DIR) is required");
const prefix = process.env.ANTDT_NATS__SUBJECT_PREFIX || "antdt.v1";
const url = args["nats-url"] || process.env.ANTDT_NATS__URL || "nats://127.0.0.1:4222";
const say = (event, fields = {}) => console.log(JSON.stringify({ event, ...fields }));

// -- the contract: schemas and subjects -------------------------------------------------

const ajv = new Ajv2020({ strict: false, allErrors: false });
const schema = (name) => JSON.parse(readFileSync(join(args.schemas, `${name}.schema.json`)));
const validators = Object.fromEntries(MESSAGES.map((n) => [n, ajv.compile(schema(n))]));
// What a client should do about each refusal code: retry, refresh, fix, give_up.
const actionOf = schema("ErrorCode")["x-client-action"];

const subject = {
  incident: (job) => `${prefix}.${job}.incident`,
  planGet: (job) => `${prefix}.${job}.plan.get`,
  specGet: (job) => `${prefix}.${job}.spec.get`,
  proposal: (job) => `${prefix}.${job}.proposal`,
};

class Invalid extends Error {}

function check(name, message) {
  const validate = validators[name];
  if (!validate(message)) {
    throw new Invalid(`${name}: ${ajv.errorsText(validate.errors)}`);
  }
  return message;
}

class Refused extends Error {
  constructor(reply) {
    super(`${reply.code}: ${reply.error}`);
    this.reply = reply;
    this.action = actionOf[reply.code] ?? "give_up";
  }
}

const codec = JSONCodec();

/** Request/reply: the reply named `replyType`, or Refused for an ErrorReply. */
async function request(nc, to, requestType, message, replyType, timeout = 5000) {
  const reply = await nc.request(to, codec.encode(check(requestType, message)), { timeout });
  const marker = reply.headers?.get(REPLY_HEADER);
  const body = codec.decode(reply.data);
  if (marker === "ErrorReply") throw new Refused(check("ErrorReply", body));
  if (marker !== replyType) throw new Invalid(`reply of type ${marker}, expected ${replyType}`);
  return check(replyType, body);
}

// -- the rule ---------------------------------------------------------------------------

/** New per-rank batches, or null when there is nothing to move. */
export function proposeBatches(plan, terms, incident) {
  const batches = [...plan.local_batch];
  const slow = incident.rank;
  if (slow >= batches.length || batches.length < 2 || incident.ratio <= 1) return null;
  // Incident.ratio compares per-sample speeds: it scales the even share, not the batch
  // the rank has now (which may already be cut for the same slowness).
  const even = batches.reduce((a, b) => a + b, 0) / batches.length;
  const target = Math.max(terms.min_local_batch[slow], Math.round(even / incident.ratio));
  const freed = Math.min(batches[slow] - target, terms.max_move[slow]);
  if (freed <= 0) return null;
  batches[slow] -= freed;
  const others = batches.map((_, r) => r).filter((r) => r !== slow);
  others.forEach((rank, i) => {
    batches[rank] += Math.floor(freed / others.length) + (i < freed % others.length ? 1 : 0);
  });
  return batches;
}

async function proposalId(source, incident, plan) {
  const key = `${incident.id}/${incident.state}/${plan.version}`;
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key));
  const hex = Buffer.from(digest).toString("hex").slice(0, 20);
  return `${source.slice(0, 64)}-${hex}`;
}

/** Propose for one incident. True: done with it (ack); false: try again later (nak). */
async function handle(nc, incident) {
  const { job, id } = incident;
  if (incident.kind !== "slow" || !["opened", "escalated"].includes(incident.state)) {
    say("skip", { job, incident: id, why: `${incident.kind} ${incident.state}` });
    return true;
  }
  try {
    const terms = await request(nc, subject.specGet(job), "SpecRequest", { job }, "SpecReply");
    const plan = await request(nc, subject.planGet(job), "PlanRequest", { job }, "Plan");
    const batches = proposeBatches(plan, terms, incident);
    if (batches === null) {
      say("skip", { job, incident: id, why: "nothing to move" });
      return true;
    }
    const proposal = {
      proposal_id: await proposalId(args.source, incident, plan),
      job,
      source: args.source,
      local_batch: batches,
      plan_version: plan.version,
      incident_id: id,
      reason: `${args.source}: rank ${incident.rank} is ${incident.ratio.toFixed(2)}x slower; ` +
        "its even share / ratio",
    };
    const record = await request(
      nc, subject.proposal(job), "ActionProposal", proposal, "ActionRecord", 15000,
    );
    say(record.result, {
      job, incident: id, proposal: proposal.proposal_id, action: record.action_id,
      plan_version: record.plan_version, local_batch: batches,
    });
    return true;
  } catch (err) {
    if (err instanceof Refused) {
      const { code, error } = err.reply;
      say("refused", { job, incident: id, code, reason: error, action: err.action });
      return !["retry", "refresh"].includes(err.action); // those come back later
    }
    if (err instanceof Invalid) {
      say("invalid", { job, incident: id, why: err.message });
      return true;
    }
    // No responder or a timeout: no controller owns the job right now. Try again.
    say("retry", { job, incident: id, why: String(err.message || err) });
    return false;
  }
}

// -- the loop: a durable JetStream consumer -----------------------------------------------

async function main() {
  const nc = await connect({ servers: url, name: `custom-policy-js-${args.durable}` });
  const jsm = await nc.jetstreamManager();
  const filter = args.job ? subject.incident(args.job) : `${prefix}.*.incident`;
  for (;;) { // the monitor creates the stream: wait for it
    try {
      await jsm.streams.info(INCIDENT_STREAM);
      break;
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
  // The recommended consumer: durable (resumes after its last ack), explicit acks, every
  // incident the stream holds on first start, redelivered after ack_wait unless acked.
  await jsm.consumers.add(INCIDENT_STREAM, {
    durable_name: args.durable,
    filter_subject: filter,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    ack_wait: nanos(30_000),
    max_deliver: 20,
  });
  const consumer = await nc.jetstream().consumers.get(INCIDENT_STREAM, args.durable);
  const messages = await consumer.consume({ max_messages: 8 });
  const stop = () => { messages.stop(); };
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
  say("ready", { durable: args.durable, subject: filter });
  for await (const msg of messages) {
    let incident;
    try {
      incident = check("Incident", codec.decode(msg.data));
    } catch (err) {
      say("invalid", { subject: msg.subject, why: String(err.message || err) });
      msg.term();
      continue;
    }
    if (await handle(nc, incident)) msg.ack();
    else msg.nak(1000);
  }
  await nc.drain();
}

await main();
