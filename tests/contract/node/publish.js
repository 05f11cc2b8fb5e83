#!/usr/bin/env node
// A broker-jobs publisher written from docs/wire-format.md alone, as a service in
// another language would write one: no broker-jobs code, only the page and amqplib.
//
//   node publish.js AMQP_URL NAMESPACE SCENARIO[,SCENARIO...] [--delay SECONDS] [--task NAME]
//
// Scenarios (`all` is the first four):
//   plain       one job with a valid payload
//   idempotent  two jobs (two message ids) with one bj-idempotency-key
//   delayed     one job due in --delay seconds (default 4.5), through the delay ladder
//   malformed   a body that is not JSON, and a JSON object the task's model rejects
//   unroutable  one job for a task that has no queue (must come back: mandatory)
//
// Every message is published with mandatory set on a confirm channel. Prints one
// JSON object to stdout: {"published": [...]}, one entry per message with its
// exchange, routing key, message id, idempotency key, due time, body and outcome
// ("stored", "returned" or "nacked"). Exits 0 when every message was stored, 1 when
// one was not, 2 on a usage or connection error.
'use strict';

const crypto = require('node:crypto');
const amqp = require('amqplib');

// --- the page's rules -------------------------------------------------------------

// "publish every job here; routing key = task name" (Broker objects).
const workExchange = (namespace) => `${namespace}.work`;

// "25 levels, level k being an exchange and a quorum queue both named jobs.delay.kk".
const DELAY_LEVELS = 25;
// "the job leaves 0.2 s early".
const EARLY_MARGIN = 0.2;

// Delayed jobs, steps 2 and 3: where a job due in `d` seconds is published.
function routeFor(namespace, task, d) {
  const n = Math.floor(d - EARLY_MARGIN);
  if (n <= 0) {
    return { exchange: workExchange(namespace), routingKey: task };
  }
  if (n >= 2 ** DELAY_LEVELS) {
    throw new RangeError(`a delay of ${d} s is beyond the longest, 2^25 - 1 seconds`);
  }
  const binary = n.toString(2); // most significant first, no leading zeros
  const level = binary.length - 1; // "the bit length of n minus one"
  const digits = binary.padStart(DELAY_LEVELS, '0').split('');
  return {
    exchange: `${namespace}.delay.${String(level).padStart(2, '0')}`,
    routingKey: `${digits.map((digit) => `${digit}.`).join('')}${task}`,
  };
}

// Properties and headers of a job (Publishing a job: Properties, Headers).
function jobMessage(task, body, { idempotencyKey, dueAt, now }) {
  const headers = {
    'bj-wire-version': 1,
    'bj-attempt': 1,
    'bj-created-at': new Date(now).toISOString(),
  };
  if (idempotencyKey !== undefined) headers['bj-idempotency-key'] = idempotencyKey;
  if (dueAt !== undefined) headers['bj-due-at'] = dueAt;
  return {
    body: Buffer.from(body, 'utf8'),
    options: {
      mandatory: true,
      contentType: 'application/json',
      contentEncoding: 'utf-8',
      deliveryMode: 2,
      messageId: crypto.randomUUID(),
      type: task,
      timestamp: Math.floor(now / 1000),
      headers,
    },
  };
}

// --- the scenarios ----------------------------------------------------------------

function messagesFor(scenario, namespace, task, delay) {
  const now = Date.now();
  const plain = (payload, extra = {}) => ({
    scenario,
    task,
    route: { exchange: workExchange(namespace), routingKey: task },
    ...jobMessage(task, JSON.stringify(payload), { now, ...extra }),
  });
  switch (scenario) {
    case 'plain':
      return [plain({ key: 'plain', n: 1 })];
    case 'idempotent': {
      const idempotencyKey = `node-pair-${crypto.randomUUID()}`;
      return [
        plain({ key: 'pair', n: 1 }, { idempotencyKey }),
        plain({ key: 'pair', n: 2 }, { idempotencyKey }),
      ];
    }
    case 'delayed': {
      const dueMs = now + delay * 1000;
      const dueAt = new Date(dueMs).toISOString();
      const message = plain({ key: 'delayed', n: 1 }, { dueAt });
      // d: the seconds from now until the due time, as the page's step 2 has it.
      message.route = routeFor(namespace, task, (dueMs - Date.now()) / 1000);
      return [message];
    }
    case 'malformed': {
      const notJson = plain({});
      notJson.body = Buffer.from('{"key": "malformed-json", n: 1', 'utf8');
      return [notJson, plain({ key: 'malformed-schema', n: 'not a number' })];
    }
    case 'unroutable': {
      const nobody = `${task}-nobody`;
      return [
        {
          scenario,
          task: nobody,
          route: { exchange: workExchange(namespace), routingKey: nobody },
          ...jobMessage(nobody, JSON.stringify({ key: 'unroutable', n: 1 }), { now }),
        },
      ];
    }
    default:
      throw new Error(`unknown scenario ${JSON.stringify(scenario)}`);
  }
}

// --- publishing -------------------------------------------------------------------

async function publishAll(url, messages) {
  const connection = await amqp.connect(url, {
    clientProperties: { connection_name: 'broker-jobs node contract publisher' },
  });
  try {
    const channel = await connection.createConfirmChannel(); // confirm.select
    // An unroutable mandatory message comes back as basic.return, before its
    // basic.ack: the ack alone does not say it reached a queue.
    const returned = new Set();
    channel.on('return', (message) => returned.add(message.properties.messageId));
    const confirms = messages.map(
      (message) =>
        new Promise((resolve) => {
          channel.publish(
            message.route.exchange,
            message.route.routingKey,
            message.body,
            message.options,
            (error) => resolve(error ? 'nacked' : 'acked'),
          );
        }),
    );
    const outcomes = await Promise.all(confirms);
    await channel.close();
    return messages.map((message, index) => {
      if (outcomes[index] === 'nacked') return 'nacked';
      return returned.has(message.options.messageId) ? 'returned' : 'stored';
    });
  } finally {
    await connection.close().catch(() => {});
  }
}

function parseArguments(argv) {
  const positional = [];
  const options = { delay: 4.5, task: 'contract.record' };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--delay') options.delay = Number(argv[++i]);
    else if (argv[i] === '--task') options.task = argv[++i];
    else positional.push(argv[i]);
  }
  if (positional.length !== 3 || !Number.isFinite(options.delay) || !options.task) {
    throw new Error(
      'usage: node publish.js AMQP_URL NAMESPACE SCENARIO[,SCENARIO...] [--delay SECONDS] [--task NAME]',
    );
  }
  const [url, namespace, scenarios] = positional;
  const names = scenarios === 'all' ? ['plain', 'idempotent', 'delayed', 'malformed'] : scenarios.split(',');
  return { url, namespace, scenarios: names, ...options };
}

async function main() {
  let args;
  let messages;
  try {
    args = parseArguments(process.argv.slice(2));
    messages = args.scenarios.flatMap((scenario) =>
      messagesFor(scenario, args.namespace, args.task, args.delay),
    );
  } catch (error) {
    process.stderr.write(`${error.message}\n`);
    return 2;
  }
  let outcomes;
  try {
    outcomes = await publishAll(args.url, messages);
  } catch (error) {
    process.stderr.write(`publishing failed: ${error.stack || error}\n`);
    return 2;
  }
  const published = messages.map((message, index) => ({
    scenario: message.scenario,
    task: message.task,
    exchange: message.route.exchange,
    routingKey: message.route.routingKey,
    messageId: message.options.messageId,
    idempotencyKey: message.options.headers['bj-idempotency-key'] ?? null,
    dueAt: message.options.headers['bj-due-at'] ?? null,
    createdAt: message.options.headers['bj-created-at'],
    body: message.body.toString('utf8'),
    outcome: outcomes[index],
  }));
  process.stdout.write(`${JSON.stringify({ published }, null, 2)}\n`);
  return outcomes.every((outcome) => outcome === 'stored') ? 0 : 1;
}

main().then((code) => {
  process.exitCode = code;
});
