/**
 * Every sentence the extension shows (status bar, details, notifications, after a
 * stop), made from the GPU service's answer with the rules of ``words.ts``. Pure: no
 * JupyterLab, so the hub's message catalogue (``docs/messages.md``) runs these same
 * functions on sample answers.
 */
import {
  billedUnits,
  count,
  duration,
  gpuHours,
  localTimes,
  moment,
  noun,
  number,
  numbers,
  period
} from './words';

export interface Budget {
  owner: 'group' | 'user';
  name: string;
  /** the three amounts are billed units, not GPU-hours (a budget in units) */
  in_units?: boolean;
  limit_gpu_hours: number;
  used_gpu_hours: number | null;
  left_gpu_hours: number | null;
  period_seconds: number;
  exhausted: boolean;
  when_exhausted: string;
}

export interface Stop {
  kind: 'idle' | 'budget' | 'max_runtime';
  at: number;
  why: string;
  avoid: string;
}

export interface LastStop {
  at: number;
  reason: string;
  text: string;
  what_to_do: string;
}

export interface ServiceAnswer {
  user: string;
  server: string;
  now: number;
  running: boolean;
  group: { name: string; display_name: string } | null;
  profile: string | null;
  flavor: { name: string; display_name: string; units: number } | null;
  gpus: number;
  gpus_text: string;
  budgets: Budget[];
  budgets_current: boolean;
  quota: {
    group: string;
    gpus_used_text: string;
    quota_gpus: number | null;
    limit_gpus: number | null;
    servers: number;
  } | null;
  stops: Stop[];
  notices: { at: number; text: string }[];
  last_stop: LastStop | null;
  // when the server running now started: a last stop before it is an earlier run's
  started: number | null;
  dashboard_url: string;
  hub_url: string;
  rule_interval: number;
  /** the policy changed while the server ran: its profile (or group) is gone */
  policy_change: string | null;
}

export interface Settings {
  budget_low_fraction: number;
  runtime_warnings: number[];
  save_before: number;
  poll_interval: number;
}

export interface StatusReply {
  service: ServiceAnswer | null;
  error: string | null;
  service_url: string;
  settings: Settings;
}

/** "12.5 of 100 GPU-hours" (or billed units): a part of a budget and the whole */
export function hoursOf(part: number | null, whole: number, inUnits = false): string {
  if (part === null) {
    return `? of ${inUnits ? billedUnits(whole) : gpuHours(whole)}`;
  }
  const [a, b] = numbers([part, whole]);
  return `${a} of ${b} ${inUnits ? noun(b, 'billed unit', 'billed units') : noun(b, 'GPU-hour', 'GPU-hours')}`;
}

/** A budget's amount in its unit: 12.5 GPU-hours, or 12.5 billed units */
function amount(b: Budget, value: number | null): string {
  const unit = b.in_units ? 'billed units' : 'GPU-hours';
  if (value === null) {
    return `? ${unit}`;
  }
  return b.in_units ? billedUnits(value) : gpuHours(value);
}

const STOP_WORDS: { [kind: string]: string } = {
  idle: 'idle stop',
  budget: 'budget stop',
  max_runtime: 'maximum runtime'
};

export function gpuText(a: ServiceAnswer): string {
  if (!a.flavor) {
    return 'no GPU';
  }
  return `${a.flavor.display_name} ×${a.gpus_text}`;
}

/** The one line the status bar shows. */
export function statusLine(
  reply: StatusReply | null,
  serverGone: boolean,
  now: number = Date.now() / 1000
): string {
  if (serverGone) {
    return 'GPU: this server is not reachable';
  }
  if (!reply) {
    return 'GPU: …';
  }
  const a = reply.service;
  if (!a) {
    return 'GPU: service unreachable';
  }
  if (!a.group) {
    return 'GPU: not charged to a group';
  }
  const parts = [a.group.display_name, gpuText(a)];
  for (const b of a.budgets) {
    const who = b.owner === 'user' ? 'you' : 'group';
    const left = amount(b, b.left_gpu_hours);
    parts.push(`${left} left (${who}, ${duration(b.period_seconds)})`);
  }
  const next = a.stops[0];
  if (next) {
    parts.push(`${STOP_WORDS[next.kind] ?? next.kind} in ${duration(next.at - now)}`);
  }
  return 'GPU: ' + parts.join(' · ');
}

/** What the details panel says when the service did not answer. */
export function unreachableText(error: string | null): string {
  return (
    `The GPU service cannot be reached (${error ?? 'no answer yet'}). ` +
    'Your notebook works on; the numbers come back when it answers.'
  );
}

/** A budget's row in the details panel: [heading, text]. */
export function budgetRow(b: Budget): [string, string] {
  const who = b.owner === 'user' ? `your budget (${b.name})` : `budget of ${b.name}`;
  const left = b.left_gpu_hours === null ? '?' : numbers([b.left_gpu_hours, b.limit_gpu_hours])[0];
  const usedUp = b.exhausted
    ? `: used up, so ${b.when_exhausted === 'stop' ? 'its servers stop' : 'new GPU servers are refused'}`
    : '';
  return [
    who,
    `${hoursOf(b.used_gpu_hours, b.limit_gpu_hours, b.in_units)} used in the last ` +
      `${period(b.period_seconds)}; ${left} left${usedUp}`
  ];
}

/** The group's use in the details panel. */
export function quotaText(quota: NonNullable<ServiceAnswer['quota']>): string {
  const of = quota.quota_gpus !== null ? ` of a ${number(quota.quota_gpus)} GPU quota` : '';
  const lim = quota.limit_gpus !== null ? `, limit ${number(quota.limit_gpus)}` : '';
  const used = `${quota.gpus_used_text} ${noun(quota.gpus_used_text, 'GPU')} in use`;
  return `${used}${of}${lim}, on ${count(quota.servers, 'server')}`;
}

/** The details panel's note while the service's numbers are behind. */
export const STALE_NOTE = 'GPU-hours could not be refreshed lately; the numbers may be behind';

/** A scheduled stop in the details panel. */
export function stopItem(s: Stop, now: number = Date.now() / 1000): string {
  return `${moment(s.at)}, in ${duration(s.at - now)}: ${s.why}. To avoid it: ${s.avoid}.`;
}

/** A notice in the details panel (its moments in the reader's time zone). */
export function noticeItem(n: { at: number; text: string }): string {
  return `${moment(n.at)}: ${localTimes(n.text)}`;
}

/** The notification of a used-up budget (``stop``: the stop it announced, if any). */
export function budgetUsedUpText(b: Budget, stop: Stop | undefined, now: number): string {
  const label = b.owner === 'user' ? `Your GPU budget (${b.name})` : `The GPU budget of ${b.name}`;
  const then = stop
    ? ` This server stops at ${moment(stop.at)}, in ${duration(stop.at - now)}: save your work.`
    : b.when_exhausted === 'stop'
      ? ''
      : ' This server keeps running; new GPU servers are refused until it frees.';
  return (
    `${label} is used up: ${hoursOf(b.used_gpu_hours, b.limit_gpu_hours, b.in_units)} in the last ` +
    `${period(b.period_seconds)}.${then}`
  );
}

/** The notification of a budget running low. */
export function budgetLowText(b: Budget): string {
  const label = b.owner === 'user' ? `Your GPU budget (${b.name})` : `The GPU budget of ${b.name}`;
  return (
    `${label} is running low: ${hoursOf(b.left_gpu_hours, b.limit_gpu_hours, b.in_units)} left in the ` +
    `last ${period(b.period_seconds)}.`
  );
}

/** The notification of an idle stop ahead. */
export function idleText(s: Stop, now: number): string {
  return (
    `Your GPU is idle: ${s.why.replace(/^the GPU is idle: /, '')}. This server stops at ` +
    `${moment(s.at)}, in ${duration(s.at - now)}, unless you ${s.avoid}.`
  );
}

/** The notification of the maximum runtime ahead. */
export function runtimeText(s: Stop, now: number): string {
  return (
    `This server reaches its maximum runtime at ${moment(s.at)}, in ${duration(s.at - now)}, ` +
    'and will be stopped. Save your work.'
  );
}

/** The notification of the documents saved before a stop. */
export function savedText(saved: string[], stop: Stop): string {
  return `Saved ${saved.join(', ')} before this server stops at ${moment(stop.at)}: ${stop.why}.`;
}

/** the after-stop title while nobody has said why */
export const UNANNOUNCED_TITLE = 'Your server has stopped';
export const STOPPED_TITLE = 'Your server was stopped';

/** After a stop the last answer announced: [text, what to do]. */
export function announcedStopWords(stop: Stop): [string, string] {
  const words: { [k: string]: [string, string] } = {
    idle: [
      "The GPU service stopped this server: its GPU was idle past the group's idle time.",
      'Start it again from the hub when you need the GPU.'
    ],
    budget: [
      `The GPU service stopped this server: ${stop.why}.`,
      'Start a GPU server again when the budget frees, or a CPU-only one now.'
    ],
    max_runtime: [
      `This server reached its maximum runtime: ${stop.why}.`,
      'Start a new server from the hub to go on.'
    ]
  };
  return words[stop.kind] ?? [stop.why, 'Start it again from the hub.'];
}

/** After a stop nobody announced: [text, what to do]. */
export const UNANNOUNCED_WORDS: [string, string] = [
  'This server is no longer running (stopped from the hub, by an admin, or by the cluster).',
  "The hub's home page says why, and starts it again."
];

/** After a stop whose reason the hub's page gave: [text, what to do]. */
export function hubReasonWords(reason: string): [string, string] {
  return [`${reason}.`, 'Start it again from the hub when you need it.'];
}
