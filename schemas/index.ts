export * from "./events.js";
export * from "./validate.js";
