/**
 * How the extension writes numbers, units, counts, durations and times: the same
 * rules as the hub's messages (``jupyterhub_gpu/core/words.py``; a test runs both on
 * the same values), so JupyterLab, the spawn form, the dashboard and the notices say
 * the same thing the same way. The GPU service sends numbers; this writes them.
 *
 * - numbers: whole numbers without ".0" (2000), one decimal from 1 up (20.5), three
 *   significant digits below 1 (0.025); numbers said together get the decimals that
 *   keep two different numbers different (1999.96 of 2000), up to MAX_DECIMALS;
 * - units: one name each (GPU-hours), singular for exactly one (1 GPU-hour);
 * - durations in words, the two largest units (1 hour 30 minutes); a budget's window
 *   after "the last" without a lone one (the last day, the last 30 days);
 * - times as 2026-12-01 15:05 CET, in the reader's time zone (the hub's texts say
 *   2026-12-01 14:05 UTC: localTimes turns them into the reader's).
 */

export const GPU_HOURS = 'GPU-hours';
export const GPU_HOUR = 'GPU-hour';
export const BILLED_UNITS = 'billed units';
export const BILLED_UNIT = 'billed unit';
/** the most decimals a number gets to stay different from another said with it */
export const MAX_DECIMALS = 4;

function decimalsOf(value: number): number {
  const size = Math.abs(value);
  if (size >= 1 || size === 0) {
    return 1;
  }
  return Math.min(2 - Math.floor(Math.log10(size)), 6);
}

/** value rounded half up to decimals (toFixed: the exact binary value), zeros dropped */
function fixed(value: number, decimals: number): string {
  let text = value.toFixed(decimals);
  if (text.includes('.')) {
    text = text.replace(/0+$/, '').replace(/\.$/, '');
  }
  return text === '-0' ? '0' : text;
}

/** values as said together: more decimals for all while two different ones read the same */
export function numbers(values: number[]): string[] {
  for (let extra = 0; ; extra++) {
    const texts = values.map(v =>
      fixed(v, Math.min(decimalsOf(v) + extra, Math.max(decimalsOf(v), MAX_DECIMALS)))
    );
    let clash = false;
    for (let i = 0; i < values.length; i++) {
      for (let j = i + 1; j < values.length; j++) {
        clash = clash || (texts[i] === texts[j] && values[i] !== values[j]);
      }
    }
    if (!clash || values.every(v => decimalsOf(v) + extra >= MAX_DECIMALS)) {
      return texts;
    }
  }
}

/** a number for people: 2000, 20.5, 0.025 */
export function number(value: number): string {
  return numbers([value])[0];
}

/** the unit after a number already written: singular for exactly one */
export function noun(text: string, singular: string, plural?: string): string {
  return text === '1' ? singular : plural ?? singular + 's';
}

/** 1 spawn, 2 spawns, 0.5 GPUs */
export function count(n: number, singular: string, plural?: string): string {
  const text = number(n);
  return `${text} ${noun(text, singular, plural)}`;
}

/** 12.5 GPU-hours, 1 GPU-hour */
export function gpuHours(value: number): string {
  return count(value, GPU_HOUR, GPU_HOURS);
}

/** 12.5 billed units, 1 billed unit */
export function billedUnits(value: number): string {
  return count(value, BILLED_UNIT, BILLED_UNITS);
}

const UNITS: [string, number][] = [
  ['day', 86400],
  ['hour', 3600],
  ['minute', 60],
  ['second', 1]
];

/** a duration in words, its two largest units: 45 seconds, 1 hour 30 minutes */
export function duration(seconds: number): string {
  let left = Math.max(Math.floor(seconds + 0.5), 0);
  if (left === 0) {
    return '0 seconds';
  }
  for (let i = 0; i < UNITS.length; i++) {
    const [name, size] = UNITS[i];
    if (left >= size) {
      const first = Math.floor(left / size);
      left -= first * size;
      let words = count(first, name);
      if (i + 1 < UNITS.length) {
        const [smaller, sizeOf] = UNITS[i + 1];
        const second = Math.floor(left / sizeOf);
        if (second) {
          words += ' ' + count(second, smaller);
        }
      }
      return words;
    }
  }
  return '0 seconds';
}

/** a rolling window after "the last": day, 30 days, 1 hour 30 minutes */
export function period(seconds: number): string {
  const text = duration(seconds);
  return text.startsWith('1 ') && !text.slice(2).includes(' ') ? text.slice(2) : text;
}

function two(n: number): string {
  return String(n).padStart(2, '0');
}

function zoneOf(moment: Date): string {
  try {
    const part = new Intl.DateTimeFormat('en-US', { timeZoneName: 'short' })
      .formatToParts(moment)
      .find(p => p.type === 'timeZoneName');
    return part ? part.value : '';
  } catch {
    return '';
  }
}

/** a moment in the reader's time zone: 2026-12-01 15:05 CET (UTC where it is not known) */
export function moment(epoch: number): string {
  const t = new Date(epoch * 1000);
  const zone = zoneOf(t);
  if (!zone) {
    return (
      `${t.getUTCFullYear()}-${two(t.getUTCMonth() + 1)}-${two(t.getUTCDate())} ` +
      `${two(t.getUTCHours())}:${two(t.getUTCMinutes())} UTC`
    );
  }
  return (
    `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())} ` +
    `${two(t.getHours())}:${two(t.getMinutes())} ${zone}`
  );
}

/** every "2026-12-01 14:05 UTC" of a hub's text in the reader's time zone */
export function localTimes(text: string): string {
  return text.replace(
    /(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}) UTC/g,
    (_found, y, mo, d, h, mi) => moment(Date.UTC(+y, +mo - 1, +d, +h, +mi) / 1000)
  );
}
