/**
 * Fixtures are exposition text laid out the way prometheus_client renders these engines' metrics
 * (sorted labels, Go-style float formatting such as `2.841733e+06` and `e+011`, HELP/TYPE pairs):
 * - vllm-0.11.txt: vLLM V1 serving text/plain 0.0.4; counters and histograms get a separate
 *   `<name>_created` gauge family; LoRA enabled, one engine.
 * - vllm-0.11-openmetrics.txt: the same server answering an OpenMetrics Accept header.
 * - vllm-0.8-old-names.txt: an older V1 server (gpu_cache_usage_perc, gpu_prefix_cache_*,
 *   time_per_output_token_seconds, no `engine` label, no LoRA).
 * - sglang.txt: SGLang in prometheus multiprocess mode (HELP "Multiprocess metric", no _created,
 *   histogram `_sum` before its buckets, a `pid` label on "all"-mode gauges).
 */
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { histogramSeries, type MetricFamilies, parsePrometheusText, samplesNamed } from "./prom-text.js";

const fixture = (name: string): string => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");

const LLAMA = "meta-llama/Llama-3.1-8B-Instruct";
const ENGINE0 = { engine: "0", model_name: LLAMA };

function only(families: MetricFamilies, sampleName: string) {
  const samples = samplesNamed(families, sampleName);
  expect(samples, sampleName).toHaveLength(1);
  return samples[0]!;
}

describe("prom-text - vLLM 0.11 fixture (0.0.4)", () => {
  const parsed = parsePrometheusText(fixture("vllm-0.11.txt"));

  it("parses every line", () => {
    expect(parsed.errors).toEqual([]);
  });

  it("types families from # TYPE and keeps their HELP", () => {
    const types = Object.fromEntries([...parsed.families.values()].map((f) => [f.name, f.type]));
    expect(types).toMatchObject({
      "vllm:num_requests_running": "gauge",
      "vllm:prompt_tokens_total": "counter",
      "vllm:prompt_tokens_created": "gauge",
      "vllm:time_to_first_token_seconds": "histogram",
      "vllm:iteration_tokens_total": "histogram",
      "vllm:cache_config_info": "gauge",
      python_gc_objects_collected_total: "counter",
    });
    expect(parsed.families.get("vllm:num_requests_running")?.help).toBe("Number of requests in model execution batches.");
  });

  it("reads a gauge", () => {
    expect(samplesNamed(parsed, "vllm:num_requests_running")).toEqual([
      { name: "vllm:num_requests_running", labels: ENGINE0, value: 12 },
    ]);
    expect(only(parsed, "vllm:kv_cache_usage_perc").value).toBe(0.4172480087912088);
  });

  it("reads counters through their _total sample, exponent notation included", () => {
    expect(only(parsed, "vllm:prompt_tokens_total").value).toBe(2841733);
    expect(only(parsed, "vllm:generation_tokens_total").value).toBe(403461);
    expect(only(parsed, "vllm:prompt_tokens_created").value).toBe(1761312387.5012047);
    const success = samplesNamed(parsed, "vllm:request_success_total").map((s) => [s.labels.finished_reason, s.value]);
    expect(success).toEqual([
      ["stop", 1201],
      ["length", 139],
      ["abort", 2],
    ]);
  });

  it("groups a histogram into buckets, sum and count", () => {
    const series = histogramSeries(parsed, "vllm:time_to_first_token_seconds");
    expect(series).toHaveLength(1);
    expect(series[0]).toEqual({
      labels: ENGINE0,
      buckets: [
        [0.001, 0],
        [0.005, 0],
        [0.01, 0],
        [0.02, 2],
        [0.04, 43],
        [0.06, 231],
        [0.08, 532],
        [0.1, 909],
        [0.25, 1163],
        [0.5, 1261],
        [0.75, 1312],
        [1, 1339],
        [2.5, 1344],
        [5, 1344],
        [7.5, 1344],
        [10, 1344],
        [20, 1344],
        [40, 1344],
        [80, 1344],
        [160, 1344],
        [640, 1344],
        [2560, 1344],
        [Number.POSITIVE_INFINITY, 1344],
      ],
      sum: 287.4193119812012,
      count: 1344,
    });
  });

  it("keeps a histogram whose name ends in _total apart from counters", () => {
    const [series] = histogramSeries(parsed, "vllm:iteration_tokens_total");
    expect(series?.count).toBe(17676);
    expect(series?.buckets).toHaveLength(14);
    expect(samplesNamed(parsed, "vllm:iteration_tokens_total")).toEqual([]);
  });

  it("reads info-style gauges with all their labels", () => {
    const info = only(parsed, "vllm:cache_config_info");
    expect(info.value).toBe(1);
    expect(info.labels).toMatchObject({ block_size: "16", num_gpu_blocks: "7282", num_cpu_blocks: "None", engine: "0" });
    expect(Object.keys(info.labels)).toHaveLength(16);
  });

  it("keeps both LoRA info samples with their timestamp values", () => {
    const lora = samplesNamed(parsed, "vllm:lora_requests_info");
    expect(lora.map((s) => [s.labels.running_lora_adapters, s.labels.waiting_lora_adapters, s.value])).toEqual([
      ["sql-lora,chat-lora", "", 1761313002.871946],
      ["sql-lora", "chat-lora", 1761312990.0412009],
    ]);
  });

  it("parses the Python process metrics too, Go-style e+011 exponent included", () => {
    expect(samplesNamed(parsed, "python_gc_objects_collected_total").map((s) => s.labels.generation)).toEqual(["0", "1", "2"]);
    expect(only(parsed, "process_virtual_memory_bytes").value).toBe(138779897856);
    expect(only(parsed, "python_info").labels.version).toBe("3.12.11");
  });
});

describe("prom-text - OpenMetrics fixture", () => {
  const om = parsePrometheusText(fixture("vllm-0.11-openmetrics.txt"));
  const text = parsePrometheusText(fixture("vllm-0.11.txt"));

  it("parses every line", () => {
    expect(om.errors).toEqual([]);
  });

  it("files counters under the base name with _total and _created samples", () => {
    const family = om.families.get("vllm:prompt_tokens");
    expect(family?.type).toBe("counter");
    expect(family?.help).toBe("Number of prefill tokens processed.");
    expect(family?.samples.map((s) => s.name)).toEqual(["vllm:prompt_tokens_total", "vllm:prompt_tokens_created"]);
    expect(om.families.has("vllm:prompt_tokens_total")).toBe(false);
  });

  it.each([
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_created",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:time_to_first_token_seconds_created",
    "vllm:lora_requests_info",
  ])("finds %s exactly as in the 0.0.4 text", (name) => {
    const fromOm = samplesNamed(om, name);
    expect(fromOm.length).toBeGreaterThan(0);
    expect(fromOm).toEqual(samplesNamed(text, name));
  });

  it("groups the histogram the same way", () => {
    expect(histogramSeries(om, "vllm:time_to_first_token_seconds")).toEqual(
      histogramSeries(text, "vllm:time_to_first_token_seconds"),
    );
  });
});

describe("prom-text - SGLang fixture (multiprocess)", () => {
  const parsed = parsePrometheusText(fixture("sglang.txt"));

  it("parses every line", () => {
    expect(parsed.errors).toEqual([]);
    expect(parsed.families.get("sglang:token_usage")?.help).toBe("Multiprocess metric");
  });

  it("groups a histogram whose _sum comes before its buckets", () => {
    const [series, ...rest] = histogramSeries(parsed, "sglang:queue_time_seconds");
    expect(rest).toEqual([]);
    expect(series?.sum).toBe(14.62093186378479);
    expect(series?.count).toBe(955);
    expect(series?.buckets[0]).toEqual([0, 0]);
    expect(series?.buckets[1]).toEqual([0.1, 901]);
    expect(series?.labels).toEqual({
      engine_type: "unified",
      model_name: "Qwen/Qwen2.5-7B-Instruct",
      moe_ep_rank: "0",
      pp_rank: "0",
      tp_rank: "0",
    });
  });

  it("keeps the pid label of all-mode gauges", () => {
    expect(only(parsed, "sglang:num_retracted_reqs").labels.pid).toBe("3417");
  });
});

describe("prom-text - syntax", () => {
  const parse = (text: string) => {
    const parsed = parsePrometheusText(text);
    expect(parsed.errors).toEqual([]);
    return parsed;
  };

  it("unescapes HELP text", () => {
    const parsed = parse("# HELP m A \\\\ backslash,\\na newline and \\t kept\n# TYPE m gauge\nm 1\n");
    expect(parsed.families.get("m")?.help).toBe("A \\ backslash,\na newline and \\t kept");
  });

  it.each([
    ["an escaped quote", 'm{a="say \\"hi\\""} 1', "say \"hi\""],
    ["an escaped backslash", 'm{a="C:\\\\dir"} 1', "C:\\dir"],
    ["an escaped newline", 'm{a="one\\ntwo"} 1', "one\ntwo"],
    ["an unknown escape kept verbatim", 'm{a="\\d+"} 1', "\\d+"],
    ["commas and braces", 'm{a="x,y{z}=1"} 1', "x,y{z}=1"],
    ["a hash", 'm{a="#1 # {b=\\"c\\"}"} 1', '#1 # {b="c"}'],
    ["an empty value", 'm{a=""} 1', ""],
    ["a backslash right before the closing quote", 'm{a="end\\\\"} 1', "end\\"],
  ])("reads a label value with %s", (_, line, expected) => {
    expect(only(parse(line), "m").labels.a).toBe(expected);
  });

  it("reads several labels around escaped values", () => {
    const labels = only(parse('m{a="1\\"",b="2,3",c="\\\\"} 1'), "m").labels;
    expect(labels).toEqual({ a: '1"', b: "2,3", c: "\\" });
  });

  it.each([
    ["NaN", Number.NaN],
    ["+Inf", Number.POSITIVE_INFINITY],
    ["-Inf", Number.NEGATIVE_INFINITY],
    ["Inf", Number.POSITIVE_INFINITY],
    ["1.5e+03", 1500],
    ["-0.25", -0.25],
    [".5", 0.5],
    ["42", 42],
    ["1e-05", 0.00001],
  ])("reads the value %s", (token, expected) => {
    expect(only(parse(`m ${token}\n`), "m").value).toBe(expected);
  });

  it("reads metric names with colons", () => {
    const parsed = parse("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n");
    expect(parsed.families.get("vllm:num_requests_running")?.samples[0]?.value).toBe(3);
  });

  it("reads 0.0.4 timestamps as milliseconds", () => {
    expect(only(parse("m 1 1700000000123\n"), "m").timestampMs).toBe(1700000000123);
    expect(only(parse("m 1\n"), "m")).not.toHaveProperty("timestampMs");
  });

  it("reads OpenMetrics timestamps as seconds once # EOF marks the format", () => {
    expect(only(parse("# TYPE m gauge\nm 1 1700000000.25\n# EOF\n"), "m").timestampMs).toBe(1700000000250);
  });

  it("ignores exemplars, with or without a timestamp before them", () => {
    const parsed = parse(
      [
        "# TYPE h histogram",
        'h_bucket{le="0.5"} 3 # {trace_id="a#b"} 0.42 1700000000.1',
        'h_bucket{le="+Inf"} 4 1700000000000 # {trace_id="c"} 9',
        "h_count 4",
        "h_sum 10.5",
        "",
      ].join("\n"),
    );
    expect(histogramSeries(parsed, "h")).toEqual([
      {
        labels: {},
        buckets: [
          [0.5, 3],
          [Number.POSITIVE_INFINITY, 4],
        ],
        sum: 10.5,
        count: 4,
      },
    ]);
  });

  it("reads Windows line endings, blank lines, comments and indented lines", () => {
    const parsed = parse(
      "# a comment\r\n\r\n   \r\n# HELP m help text\r\n# TYPE m gauge\r\n  m{a=\"1\"} 2\r\n\tm{a=\"2\"} 3\r\n",
    );
    expect(samplesNamed(parsed, "m").map((s) => [s.labels.a, s.value])).toEqual([
      ["1", 2],
      ["2", 3],
    ]);
    expect(parsed.families.get("m")?.help).toBe("help text");
  });

  it("accepts an empty label set, a trailing comma, blanks inside braces and tabs between fields", () => {
    const parsed = parse('a{} 1\nb{x="1",} 2\nc{ x = "1" , y="2" } 3\nd\t4\t1700000000000\n');
    expect(only(parsed, "a").labels).toEqual({});
    expect(only(parsed, "b").labels).toEqual({ x: "1" });
    expect(only(parsed, "c").labels).toEqual({ x: "1", y: "2" });
    expect(only(parsed, "d").timestampMs).toBe(1700000000000);
  });

  it("files samples without metadata as untyped families", () => {
    const parsed = parse("foo_total 3\nfoo_bucket{le=\"1\"} 2\n");
    expect(parsed.families.get("foo_total")?.type).toBe("untyped");
    expect(only(parsed, "foo_total").value).toBe(3);
    expect(only(parsed, "foo_bucket").labels.le).toBe("1");
  });

  it("assembles a histogram from untyped samples", () => {
    const parsed = parse('h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 5\nh_sum 7\nh_count 5\n');
    expect(histogramSeries(parsed, "h")).toEqual([
      {
        labels: {},
        buckets: [
          [1, 2],
          [Number.POSITIVE_INFINITY, 5],
        ],
        sum: 7,
        count: 5,
      },
    ]);
  });

  it("keeps OpenMetrics UNIT and the info type", () => {
    const parsed = parse(
      '# TYPE t_seconds gauge\n# UNIT t_seconds seconds\nt_seconds 1\n# TYPE build info\nbuild_info{v="1"} 1\n# EOF\n',
    );
    expect(parsed.families.get("t_seconds")?.unit).toBe("seconds");
    expect(parsed.families.get("build")?.type).toBe("info");
    expect(only(parsed, "build_info").labels.v).toBe("1");
  });

  it("reads the OpenMetrics unknown type as untyped", () => {
    expect(parse("# TYPE u unknown\nu 1\n").families.get("u")?.type).toBe("untyped");
  });

  it("attaches a sample to its family even when another family came in between", () => {
    const parsed = parse("# TYPE a gauge\na{x=\"1\"} 1\n# TYPE b gauge\nb 2\na{x=\"2\"} 3\n");
    expect(parsed.families.get("a")?.samples.map((s) => s.value)).toEqual([1, 3]);
    expect(parsed.families.get("b")?.samples.map((s) => s.value)).toEqual([2]);
  });

  it("groups interleaved histogram series by label set, whatever the label order", () => {
    const parsed = parse(
      [
        "# TYPE h histogram",
        'h_bucket{m="a",le="1"} 1',
        'h_bucket{m="b",le="1"} 10',
        'h_bucket{le="+Inf",m="a"} 2',
        'h_bucket{m="b",le="+Inf"} 20',
        'h_sum{m="b"} 100',
        'h_sum{m="a"} 3',
        'h_count{m="a"} 2',
        "",
      ].join("\n"),
    );
    expect(histogramSeries(parsed, "h")).toEqual([
      {
        labels: { m: "a" },
        buckets: [
          [1, 1],
          [Number.POSITIVE_INFINITY, 2],
        ],
        sum: 3,
        count: 2,
      },
      {
        labels: { m: "b" },
        buckets: [
          [1, 10],
          [Number.POSITIVE_INFINITY, 20],
        ],
        sum: 100,
        // No _count sample: the +Inf bucket stands in.
        count: 20,
      },
    ]);
  });

  it("sorts buckets by bound", () => {
    const parsed = parse('# TYPE h histogram\nh_bucket{le="+Inf"} 3\nh_bucket{le="10"} 2\nh_bucket{le="1"} 1\n');
    expect(histogramSeries(parsed, "h")[0]?.buckets.map(([le]) => le)).toEqual([1, 10, Number.POSITIVE_INFINITY]);
  });

  it("gives labels no inherited keys", () => {
    const labels = only(parse('m{__proto__="p",x="1"} 1\n'), "m").labels;
    expect(labels.constructor).toBeUndefined();
    expect(labels.toString).toBeUndefined();
    expect(Object.hasOwn(labels, "__proto__")).toBe(true);
    expect(Object.getOwnPropertyDescriptor(labels, "__proto__")?.value).toBe("p");
    expect(JSON.stringify(labels)).toBe('{"__proto__":"p","x":"1"}');
  });

  it("returns nothing for unknown names", () => {
    const parsed = parse("m 1\n");
    expect(samplesNamed(parsed, "nope")).toEqual([]);
    expect(samplesNamed(parsed, "nope_total")).toEqual([]);
    expect(histogramSeries(parsed, "nope")).toEqual([]);
  });

  it("parses an empty document", () => {
    expect(parse("")).toEqual({ families: new Map(), errors: [] });
  });
});

describe("prom-text - malformed input", () => {
  it("records each bad line and keeps every good one", () => {
    const lines = [
      "# TYPE good gauge", // 1
      'good{i="1"} 1', // 2
      "this is not a sample", // 3
      'good{i="2" 2', // 4
      "good{i=2} 3", // 5
      'good{i="3"} abc', // 6
      'good{i="4"} 4', // 7
      'good{i="5"} 5 6 7', // 8
      'good{i="6",i="7"} 8', // 9
      'good{i="8"}', // 10
      'good{i="9} 9', // 11
      "{} 1", // 12
      'good{i="10"} 0x10', // 13
      'good{i="11"} 11 NaN', // 14
      "good.name 1", // 15
      'good{i="12"} 12', // 16
      "# TYPE h histogram", // 17
      "h_bucket 1", // 18
      'h_bucket{le="x"} 1', // 19
      'h_bucket{le="+Inf"} 2', // 20
      "h 3", // 21
      "# TYPE", // 22
      "# TYPE t bogus", // 23
      'good{i="13"} 13', // 24
    ];
    const parsed = parsePrometheusText(`${lines.join("\n")}\n`);
    expect(samplesNamed(parsed, "good").map((s) => s.labels.i)).toEqual(["1", "4", "12", "13"]);
    expect(histogramSeries(parsed, "h")).toEqual([
      { labels: {}, buckets: [[Number.POSITIVE_INFINITY, 2]], sum: null, count: 2 },
    ]);
    const bad = [3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 18, 19, 21, 22, 23];
    expect(parsed.errors.map((e) => e.line)).toEqual(bad);
    expect(parsed.errors.map((e) => e.text)).toEqual(bad.map((n) => lines[n - 1]));
    for (const error of parsed.errors) expect(error.reason).not.toBe("");
    expect(parsed.families.has("t")).toBe(false);
  });

  it("does not mistake inherited object keys for type names", () => {
    const parsed = parsePrometheusText("# TYPE x constructor\n# TYPE y toString\n");
    expect(parsed.errors.map((e) => e.line)).toEqual([1, 2]);
    expect(parsed.families.size).toBe(0);
  });

  it("names the problem in the reason", () => {
    const { errors } = parsePrometheusText('m{a="1",a="2"} 1\nm{a="1"} nope\n');
    expect(errors[0]?.reason).toMatch(/duplicate label a/);
    expect(errors[1]?.reason).toMatch(/invalid value/);
  });

  it("rejects a second TYPE and a TYPE after samples, keeping the first reading", () => {
    const parsed = parsePrometheusText("# TYPE a gauge\n# TYPE a counter\nb 1\n# TYPE b counter\na 2\n");
    expect(parsed.errors.map((e) => e.line)).toEqual([2, 4]);
    expect(parsed.families.get("a")?.type).toBe("gauge");
    expect(parsed.families.get("b")?.type).toBe("untyped");
    expect(only(parsed, "a").value).toBe(2);
    expect(only(parsed, "b").value).toBe(1);
  });

  it("keeps the first HELP when one is repeated", () => {
    const parsed = parsePrometheusText("# HELP a first\n# HELP a second\na 1\n");
    expect(parsed.errors.map((e) => e.line)).toEqual([2]);
    expect(parsed.families.get("a")?.help).toBe("first");
  });

  it("reads an unsupported OpenMetrics type as untyped and says so", () => {
    const parsed = parsePrometheusText("# TYPE g gaugehistogram\ng_gcount 1\n");
    expect(parsed.errors.map((e) => e.line)).toEqual([1]);
    expect(parsed.families.get("g")?.type).toBe("untyped");
    expect(only(parsed, "g_gcount").value).toBe(1);
  });

  it("stops at content after # EOF", () => {
    const parsed = parsePrometheusText("a 1\n# EOF\nb 2\nc 3\n");
    expect(parsed.errors).toEqual([{ line: 3, text: "b 2", reason: "content after # EOF" }]);
    expect(samplesNamed(parsed, "a")).toHaveLength(1);
    expect(samplesNamed(parsed, "c")).toEqual([]);
  });

  it("reports 1-based line numbers with Windows line endings", () => {
    const { errors } = parsePrometheusText("a 1\r\nbroken\r\n");
    expect(errors).toEqual([{ line: 2, text: "broken", reason: expect.any(String) }]);
  });

  it("survives non-exposition bodies such as an HTML error page", () => {
    const parsed = parsePrometheusText("<html>\n<body>502 Bad Gateway</body>\n</html>\n");
    expect(parsed.families.size).toBe(0);
    expect(parsed.errors).toHaveLength(3);
  });
});
